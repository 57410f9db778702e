"""Tasks: datasets, the simulated federation and the models (import submodules directly)."""
