from gpumagic.cli import run

run()
