"""Says whether the pytest process (the driver) started CUDA by the session's end."""
def pytest_sessionfinish(session):
    import torch
    print(f"\nDRIVER cuda initialized: {torch.cuda.is_initialized()}", flush=True)
