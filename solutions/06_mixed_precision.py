"""Solutions of the exercises in notebooks/06_mixed_precision.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
k_min = next(k for k in range(40) if (torch.tensor(1e-8) * 2**k).half().item() != 0)
print(k_min, (torch.tensor(1e-8) * 2**k_min).half().item())
check("06.1", k_min);
