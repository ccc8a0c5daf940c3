"""The real object-store servers kerasdist's tests start: S3 (SeaweedFS, `s3_test_server`) and GCS
(fake-gcs-server, `gcs_test_server`), on 127.0.0.1 only, always stopped (`server_process`).

Test code, not part of kerasdist: the wheel does not ship it and `import kerasdist` never loads it.
It lives under tests/ so that R CMD check, which runs the R tests from the built tarball without
`tools/` or `tests/python`, still has it: pytest finds it through `pythonpath` in pyproject.toml,
the R tests through `test_path("..")` (helper-kerasdist.R), the benchmarks and the Slurm test
cluster by putting tests/ on `sys.path`.
"""
