"""Developer tools that drive the engine or ``fimls serve`` from outside.

None of this runs inside the language server; the ``fimls`` command line reaches it through
its ``bench``, ``soak`` and ``tasks`` subcommands.

* :mod:`fimls.tools.harness`: what the tools and the end-to-end tests share: fill-in-the-middle
  task sets (:class:`~fimls.tools.harness.Task`, :func:`~fimls.tools.harness.load_tasks`),
  UTF-16 LSP positions, and an LSP client that starts ``fimls serve`` and waits for the model.
* :mod:`fimls.tools.bench`: ``fimls bench``, speculative decoding against plain decoding on
  the same prompts, and the typing-the-suggestion scenario through ``fimls serve``.
* :mod:`fimls.tools.soak`: ``fimls soak``, thousands of requests with random edits against one
  server: memory growth, errors, latency.
* :mod:`fimls.tools.tasks`: ``fimls tasks``, task sets made from a repository's real edit
  history (``from-git``) or from spans of existing files (``from-files``).
"""
