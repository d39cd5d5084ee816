#!/usr/bin/env python3
"""Writes a one-layer image as a docker-archive tarball (what `docker save`
writes and `ctr images import` reads) from a root file system folder, so that
images can be made and imported where none can be pulled.

    image-archive.py --rootfs DIR --tag NAME:TAG [--tag NAME:TAG ...] --out FILE.tar
                     [--entrypoint JSON-LIST] [--cmd JSON-LIST] [--user UID:GID]
                     [--env K=V ...]

Files are owned by root in the layer and keep their modes; timestamps are
zero, so the same folder gives the same image ID."""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def layer_bytes(rootfs):
    """The layer: every file, folder and symlink under rootfs, sorted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(rootfs):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(dirpath, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mtime = 0
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def add_bytes(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rootfs", required=True)
    parser.add_argument("--tag", required=True, action="append")
    parser.add_argument("--out", required=True)
    parser.add_argument("--entrypoint", default="[]", help="a JSON list")
    parser.add_argument("--cmd", default="[]", help="a JSON list")
    parser.add_argument("--user", default="")
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    if not os.path.isdir(args.rootfs):
        sys.exit(f"image-archive.py: --rootfs {args.rootfs} is not a folder")
    for tag in args.tag:
        if ":" not in tag.rsplit("/", 1)[-1]:
            sys.exit(f"image-archive.py: --tag {tag} must be NAME:TAG")
    try:
        entrypoint = json.loads(args.entrypoint)
        cmd = json.loads(args.cmd)
    except json.JSONDecodeError as err:
        sys.exit(f"image-archive.py: --entrypoint or --cmd is not JSON: {err}")

    layer = layer_bytes(args.rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Cmd": cmd,
            "User": args.user,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"] + args.env,
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "hack/image-archive.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":", 1)[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": args.tag, "Layers": [layer_name]}]

    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w") as tar:
        add_bytes(tar, config_name, config_bytes)
        add_bytes(tar, layer_name, layer)
        add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
    os.replace(tmp, args.out)
    print(f"{args.out}: {', '.join(args.tag)}, layer {len(layer)} bytes, {diff_id[:19]}")


if __name__ == "__main__":
    main()
