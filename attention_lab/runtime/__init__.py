"""runtime: the process around the math. Which device and dtype, autocast, eval_mode, GPU synchronisation and
decoding threads (device.py); the dtype that decodes fastest here, measured (decoding.py); how OpenMP threads wait (omp.py); several processes (distributed.py); the matmul
peak in the run's dtype, the MFU denominator (flops.py); the command lines' `error:` line (cli.py).

May import: torch and the standard library only, nothing of the project (attention_lab/__init__.py, ROOMS).
"""
