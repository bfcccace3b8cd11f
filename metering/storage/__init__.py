"""Storage: the only package that speaks SQL."""
