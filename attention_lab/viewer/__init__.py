"""viewer: what a person opens. The attention pages, one offline HTML file each (page.py with assets/), the
report sample.py writes for a generated text (report.py), the head-role timeline read back from TensorBoard
(timeline.py). `python -m attention_lab.viewer FOLDER` (re)builds a page.

May import: model/, data/, runtime/, store/ (where a run's files are), interp/ (the role table). Never training/.
"""
