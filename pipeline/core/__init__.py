"""Config, storage, manifests, logging and process helpers shared by every stage."""
