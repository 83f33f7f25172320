from shared.store.repo import Store, get_store

__all__ = ["Store", "get_store"]
