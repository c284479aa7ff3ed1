"""Training scripts written as a user would write them, one per kind of bottleneck, for tests/test_diagnose.py.

Each defines ``make_model()``, ``make_loader()`` and ``make_optimizer(model)``, so it also runs from the command line:
``python -m helpers.diagnose tests/workloads/tiny_mlp.py``. None is tuned to the diagnosis; each is sized to be
clearly one kind, so that its verdict does not follow the machine's noise.
"""
