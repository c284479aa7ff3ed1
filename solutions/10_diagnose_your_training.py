"""Solutions to the exercises of notebooks/10_diagnose_your_training.ipynb (shown there by helpers.course.solution).

Each section runs in the notebook's namespace and ends with the exercise's own check.
"""
# %% exercise 1
outside = 1 - 5900 / 14000  # 58 % of the real step is spent outside the model: ≥ 20 %, input-side
waiting = (6.0 + 0.5) / (6.0 + 0.5 + 3.0 + 6.0 + 1.5)  # 38 %: the synchronised phases agree (≥ 10 %)
input_slower = 9000 < 14000  # and the pipeline alone is slower than the model alone
copy_longer = 0.5 > 6.0  # copying does not take longer than waiting: input, not transfer (the floors never count)
answer_bottleneck = "input"
check("10.1", answer_bottleneck)
