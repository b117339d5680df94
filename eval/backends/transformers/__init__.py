"""The transformers backend (``backend``) and the helpers only it uses: the turn cache
(``turn_cache``), the masks of a cached turn's prefill (``prefill_masks``), per-image pixel values
(``pixel_cache``) and images resized ahead of a fixed-size processor (``image_resize``)."""
