"""`spectune decode`: one configuration, no study (`run`), and the transformers `generate` peer it
times against (`peer`)."""
