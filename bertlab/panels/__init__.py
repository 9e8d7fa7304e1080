"""One Panel class per dashboard tab."""
