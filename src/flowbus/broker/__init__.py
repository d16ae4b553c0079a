"""The broker process: a ring broker's routing core, its durable store, its client sessions."""
