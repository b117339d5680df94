"""The vllm backend (``backend``) and what only it uses: requests rendered off the engine's thread
(``render_thread``) and its limits read as vLLM reads them (``limits``)."""
