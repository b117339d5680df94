"""The vllm backend (``backend``) and what only it uses: images decoded once per live
conversation (``decoded_images``)."""
