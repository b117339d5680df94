"""The vllm backend (``backend``) and what only it uses: requests rendered off the engine's thread
(``render_thread``)."""
