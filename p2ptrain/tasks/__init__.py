"""Training tasks: the model, data and loss one run trains (built-in ``bytelm`` or a user task)."""
