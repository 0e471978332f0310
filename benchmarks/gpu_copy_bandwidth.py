import torch, time, ctypes, numpy as np
n = 1 << 28  # 1 GiB of float32
x = torch.randn(n, device="cuda"); torch.cuda.synchronize()
def bench(name, h):
    for nb in (False, True):
        torch.cuda.synchronize(); t = time.perf_counter()
        h.copy_(x, non_blocking=nb); t1 = time.perf_counter() - t
        torch.cuda.synchronize(); t2 = time.perf_counter() - t
        print(f"{name} D2H non_blocking={nb}: returned after {t1*1e3:.1f} ms, done after {t2*1e3:.1f} ms ({4*n/t2/1e9:.1f} GB/s)")
    torch.cuda.synchronize(); t = time.perf_counter()
    x.copy_(h, non_blocking=True); t1 = time.perf_counter() - t; torch.cuda.synchronize(); t2 = time.perf_counter() - t
    print(f"{name} H2D non_blocking=True: returned after {t1*1e3:.1f} ms, done after {t2*1e3:.1f} ms ({4*n/t2/1e9:.1f} GB/s)")
bench("torch pin_memory", torch.empty(n).pin_memory())
a = np.zeros(n + 1024, dtype=np.float32); off = (-a.ctypes.data % 4096) // 4; a = a[off:off + n]
r = torch.cuda.cudart().cudaHostRegister(a.ctypes.data, 4 * n, 1); print("cudaHostRegister rc", r)
bench("cudaHostRegister", torch.from_numpy(a))
bench("pageable", torch.from_numpy(np.zeros(n, dtype=np.float32)))
