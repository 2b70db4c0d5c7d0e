"""Finds where File.read_async hangs on the real driver: runs variants of the GPU test's scenario in
children with a time limit; a child that hangs gets its threads' backtraces from cuda-gdb."""
import os
import subprocess
import sys
import textwrap

PRE = """
import faulthandler, sys, time, os, torch, cmt.io
faulthandler.dump_traceback_later(40, exit=False)
size = int(os.environ.get('HANG_MB', '256')) << 20
if not os.path.exists('data.bin'):
    ref = torch.randint(0, 256, (size,), dtype=torch.uint8, device='cuda')
    open('data.bin', 'wb').write(ref.cpu().numpy().tobytes())
ref = torch.from_numpy(__import__('numpy').fromfile('data.bin', dtype='uint8')).cuda()
s = torch.cuda.Stream()
dst = torch.zeros(size, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
print('setup done', flush=True)
"""
VARIANTS = {
    "nosleep": """
with cmt.io.open('data.bin', 'r') as f:
    fut = f.read_async(dst, s)
    print('submitted', flush=True)
    print('bytes', fut.check_bytes_done(timeout=30), flush=True)
    s.synchronize()
    print('equal', torch.equal(dst, ref), flush=True)
""",
    "prewarm": """
with cmt.io.open('data.bin', 'r') as f:
    f.read(dst)
    torch.cuda.synchronize()
    print('sync read done', flush=True)
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        dst.fill_(7)
        fut = f.read_async(dst, s)
    print('submitted', flush=True)
    print('bytes', fut.check_bytes_done(timeout=30), flush=True)
    s.synchronize()
    print('equal', torch.equal(dst, ref), flush=True)
""",
    "test": """
with cmt.io.open('data.bin', 'r') as f:
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        dst.fill_(7)
        t0 = time.perf_counter()
        fut = f.read_async(dst, s)
        print('submitted in us', round((time.perf_counter() - t0) * 1e6), flush=True)
        same = torch.equal(dst, ref)
    s.synchronize()
    print('bytes', fut.check_bytes_done(timeout=30), 'same', same, flush=True)
""",
    "loop": """
with cmt.io.open('data.bin') as f:
    f.read(ref)
    for i in range(3):
        with torch.cuda.stream(s):
            torch.cuda._sleep(100_000_000)
            dst.zero_()
            t0 = time.perf_counter()
            fut = f.read_async(dst, s)
            us = (time.perf_counter() - t0) * 1e6
            same = torch.equal(dst, ref)
        s.synchronize()
        print('round', i, 'returned us', round(us), 'bytes', fut.check_bytes_done(timeout=30), 'same', same, flush=True)
""",
    "legacy": """
with cmt.io.open('data.bin', 'r') as f:
    fut = f.read_async(dst, 0)
    print('submitted', flush=True)
    print('bytes', fut.check_bytes_done(timeout=30), flush=True)
""",
}

def main():
    os.chdir(sys.argv[1] if len(sys.argv) > 1 else "/tmp")
    env = dict(os.environ, CMT_LOG="debug")
    for name in (sys.argv[2].split(",") if len(sys.argv) > 2 else VARIANTS):
        print(f"===== {name}", flush=True)
        p = subprocess.Popen([sys.executable, "-c", PRE + textwrap.dedent(VARIANTS[name])], env=env)
        try:
            p.wait(timeout=50)
            print(f"===== {name} exit {p.returncode}", flush=True)
            continue
        except subprocess.TimeoutExpired:
            print(f"===== {name} HUNG: backtraces", flush=True)
        try:
            subprocess.run(["cuda-gdb", "-p", str(p.pid), "-batch", "-ex", "info threads",
                            "-ex", "thread apply all bt 25"], timeout=90)
        except Exception as e:  # noqa: BLE001
            print("cuda-gdb failed:", e)
        p.kill()
        p.wait()

main()
