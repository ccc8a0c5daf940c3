"""What one `make_or_restore_model` GETs from S3 (kerasdist's SeaweedFS test server on 127.0.0.1):
a fresh manager, two checkpoints of a state of SIZE (default 600M) in the store, every s3fs
`get_object` counted by file. Prints one JSON line: seconds, GETs, bytes, and per file (GETs,
bytes). Usage: PYTHONPATH=$PWD/python python bench/history/probes/probe_s3_restore_gets.py [SIZE]"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import s3fs

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: _common, bench_checkpoint_scale

import kerasdist  # noqa: E402
from _common import start_s3_test_server  # noqa: E402
from bench_checkpoint_scale import build_model, parse_size, prepared_model, width_for  # noqa: E402
from kerasdist.checkpoint import save_checkpoint  # noqa: E402


def main(size: str) -> dict:
    width = width_for(parse_size(size))
    model = prepared_model(width)
    server = start_s3_test_server()
    try:
        options = server.storage_options()
        url = f"s3://{server.make_bucket()}/run"
        save_checkpoint(model, url, storage_options=options, epoch=1)
        model.optimizer.iterations.assign_add(1)
        save_checkpoint(model, url, storage_options=options, epoch=2)
        fetched, call = [], s3fs.S3FileSystem._call_s3

        async def counting(self, method, *args, **kwargs):
            response = await call(self, method, *args, **kwargs)
            if method == "get_object":
                fetched.append(("/".join(kwargs["Key"].split("/")[-2:]), int(response["ContentLength"])))
            return response

        s3fs.S3FileSystem._call_s3 = counting
        started = time.perf_counter()
        kerasdist.make_or_restore_model(url, lambda: build_model(width), storage_options=options)
        seconds = time.perf_counter() - started
    finally:
        server.stop()
    by_file: dict[str, list[int]] = {}
    for name, size_of in fetched:
        by_file.setdefault(name, [0, 0])
        by_file[name][0] += 1
        by_file[name][1] += size_of
    return {"seconds": round(seconds, 2), "gets": len(fetched), "bytes": sum(b for _, b in fetched), "by_file": by_file}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "600M")))
