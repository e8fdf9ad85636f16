"""The ``[task]`` data settings: accepted forms and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2ptrain.config.schema import ConfigError, TaskSection, parse_config


def test_data_path_accepts_paths_globs_and_http_urls() -> None:
    assert TaskSection(data_path=Path("/data/corpus")).data_path == "/data/corpus"
    assert TaskSection(data_path="/data/**/*.jsonl").data_path == "/data/**/*.jsonl"
    url = "https://example.org/corpus/SHA256SUMS"
    assert TaskSection(data_path=url).data_path == url  # not collapsed to "https:/" as a Path would
    assert TaskSection().data_path is None


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ({"data_path": "file:///srv/data"},
         "task.data_path: cannot read a file:// URL (these can be read: http://, https://, s3://"),
        ({"data_path": "  "}, "task.data_path: must be a path, a glob or a URL (http(s)://, or an object store's)"),
        ({"data_format": "csv"}, "task.data_format: Input should be 'auto', 'text', 'jsonl' or 'parquet'"),
        ({"text_field": ""}, "task.text_field: String should have at least 1 character"),
        ({"buffer_mb": 0}, "task.buffer_mb: Input should be greater than or equal to 1"),
        ({"buffer_mb": True}, "task.buffer_mb: Input should be a valid integer"),
        ({"buffer_mb": "64"}, "task.buffer_mb: Input should be a valid integer"),
        ({"cache_max_mb": -1}, "task.cache_max_mb: Input should be greater than or equal to 0"),
        ({"download_attempts": 21}, "task.download_attempts: Input should be less than or equal to 20"),
        ({"download_timeout": 0}, "task.download_timeout: Input should be greater than 0"),
        ({"max_shard_mb": 0}, "task.max_shard_mb: Input should be greater than or equal to 1"),
        ({"max_shard_mb": "1024"}, "task.max_shard_mb: Input should be a valid integer"),
        ({"data_index_sha256": "ABC"},
         "task.data_index_sha256: must be a sha256 digest: 64 lowercase hex digits, as sha256sum prints them"),
    ],
)
def test_bad_data_settings_are_one_line_naming_the_field(task: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"task": task}, "node.toml", environ={})
    message = str(info.value)
    assert message.startswith(f"node.toml: {expected}") and "\n" not in message


def test_env_override_sets_the_buffer() -> None:
    config = parse_config({}, "defaults", environ={"P2PTRAIN_TASK__BUFFER_MB": "8"})
    assert config.task.buffer_mb == 8
