"""The openai backend (``backend``) and what only it uses: the adaptive in-flight limit
(``inflight``) and the server's wait hints (``retries``)."""
