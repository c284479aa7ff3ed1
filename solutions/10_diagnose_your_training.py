"""Solutions to the exercises of notebooks/10_diagnose_your_training.ipynb (shown there by helpers.course.solution).

Each section runs in the notebook's namespace and ends with the exercise's own check.
"""
# %% exercise 1
input_slower = 9000 < 14000  # the pipeline alone is slower than the model alone: input, the first rule
wait_share = (6.0 + 0.5) / sum(exercise_phases.values())  # 38 % ≥ 20 %, mostly waiting (not copying): input too
answer_bottleneck = "input"
check(answer_bottleneck, classify(exercise_phases, 9000, 14000, 1.2)[0], unset=NOT_ATTEMPTED)
