"""`python -m bertlab.serving NOTEBOOK [Voila options]` (what `bertlab serve` runs)."""

from bertlab.serving.app import main

main()
