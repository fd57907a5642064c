"""Next-edit suggestions: an edit on one line recognised (``change``), the same change found
where the old form still stands (``apply``, ``targets``)."""
