"""Solutions of the exercises in notebooks/08_compute_memory_overhead.ipynb, shown there with helpers.course.solution.

Each section runs in the notebook's namespace after the cells above it and ends with the exercise's check.
"""

# %% exercise 1
first = next(iter(compiled.values()))  # the first precision compiled
if "error" not in first and first["break_even_steps"] is not None:
    steps = first["compile_seconds"] / ((first["eager_ms"] - first["compiled_ms"]) / 1e3)
check("08.1", steps);


# %% exercise 2
relu_intensity = 1 / (4 + 4)
check("08.2", relu_intensity)
print(f"{relu_intensity} FLOP/byte, far below the ridge point of {ridge:.1f}: memory-bound")
