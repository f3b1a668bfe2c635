"""The shells: thin front-ends over the layers below, where a newcomer finds every entry point.

- :mod:`.magic`: ``%%gpuprofile`` / ``%gpuprofile`` (``%load_ext gpumagic``);
- :mod:`.tune_magic`: ``%gputune``;
- :mod:`.timeit_magic`: ``%gputimeit`` / ``%%gputimeit``;
- :mod:`.cli`: the ``gpumagic`` command line, a module per subcommand;
- :mod:`.api`: ``gpumagic.profile()`` and ``gpumagic.Profiler`` for plain Python;
- :mod:`.huggingface`: ``GpuProfileCallback`` for the Hugging Face ``Trainer`` (public path
  :mod:`gpumagic.integrations.huggingface`).

A shell parses options, runs the user's code, and shows what the layers below return; the logic
lives below it, where plain pytest reaches it.
"""
