"""Pure computations behind the panels."""
