from shared.store.repo import Store, get_store, reset_store, set_store

__all__ = ["Store", "get_store", "reset_store", "set_store"]
