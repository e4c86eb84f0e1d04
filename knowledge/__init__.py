"""Framework and GPU knowledge (data files) and the search over it."""
