"""Solutions to the exercises of notebooks/11_small_gpt.ipynb (shown there by helpers.course.solution).

Each section runs in the notebook's namespace and ends with the exercise's own check.
"""
# %% exercise 1
weights = 85_000_000 + 50_257 * 768      # the blocks and the tied output matrix (a matmul); the tables are lookups
flops_gpt2 = 6 * weights + 12 * 12 * 1024 * 768  # 6 N + 12 L T d: about 0.85 GFLOP per token
check("11.1", flops_gpt2)

# %% exercise 2
gib_states = 16 * n_total / 2**30  # 4 (weight) + 4 (gradient) + 8 (AdamW's two moments) bytes: about 1.9 GiB
check("11.2", gib_states)
