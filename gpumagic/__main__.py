from gpumagic.shells.cli import run

run()
