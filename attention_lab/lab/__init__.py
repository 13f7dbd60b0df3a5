"""lab: the live lab, a local web app where any text, checkpoint and head intervention answers at once
(`python -m attention_lab.lab`, docs/lab.md).

    __main__.py   the command: the runs and models to serve, the address; prints the URL, stops on Ctrl-C
    models.py     the registry: only what was named at start, by id; checkpoints by folder name, never a path;
                  loaded lazily, the last few kept in memory
    requests.py   validation at the edge: body size before parsing, UTF-8, JSON, every field's type and range
    app.py        the Starlette app: the page, the JSON API, and the one worker thread every model
                  computation runs on

A thin layer: what an endpoint computes comes from interp/ (analysis, interventions), viewer/ (the page and its
data island) and sampling.py (generation); nothing here does analysis math.

May import: model/, data/, runtime/, store/, interp/, viewer/, sampling.py, interop/ (attention_lab/__init__.py,
ROOMS). Nothing imports it but the root `attention_lab.show` (notebooks).
"""
