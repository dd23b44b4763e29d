"""tmem: toy transformers as associative memories."""
