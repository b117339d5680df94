"""Paths from a bundle stay inside it (chexpercept.containment): the class of issue 21 item 1.

Members: ``..`` in relative paths, absolute paths, drive letters and ``~``, backslashes,
percent-encoded and Unicode look-alike dots, NUL bytes, empty parts; key_id / pair_id / dicom_id used
as path parts (``../x``, ``/abs``, empty, ``.``); file links and folder links out of the tree (links
that stay inside, and a bundle folder that is itself a link, are fine); SHA256SUMS.txt lines that
leave the tree; non-images (text, GIF) behind an image extension; a JPEG behind a ``.png`` name (its
MIME type comes from its bytes). Each is refused by validation (whatever ``check_images``), by the
datasets builder, and by every backend's image function, and nothing outside reaches an API.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os

import pytest
from PIL import Image

from chexpercept.bundle import read_bundle
from chexpercept.containment import (
    ContainmentError,
    ImageBytes,
    Tree,
    check_name,
    image_data_url,
    image_file,
    name_problem,
    open_image,
    output_path,
    read_image,
    relative_problem,
    resolve_inside,
)
from chexpercept.errors import BundleValidationError

SECRET = b"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"


# ------------------------------------------------------------------------------------- the rule
@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("../x", "'/'"),
        ("/abs", "'/'"),
        ("", "empty"),
        (".", "folder reference"),
        ("..", "folder reference"),
        ("a\\b", "backslash"),
        ("a\x00b", "NUL"),
        ("%2e%2e", "percent-encoded"),
        ("\uff0e\uff0e", "U+FF0E FULLWIDTH FULL STOP"),
        ("\u2024\u2024", "U+2024"),
        ("ab\u0301", "non-ASCII"),
        ("a\nb", "control character"),
        (".hidden", "starts with '.'"),
        ("-rf", "starts with '-'"),
        ("name ", "ends with a space"),
        ("a:b", "':'"),
        ("x" * 256, "longer than 255"),
        (None, "got null"),
        (["a"], "got list"),
    ],
)
def test_unsafe_names_are_refused_with_the_reason(value, reason):
    problem = name_problem(value)
    assert problem is not None and reason in problem
    with pytest.raises(ContainmentError, match="pair_id"):
        check_name(value, "pair_id")


@pytest.mark.parametrize(
    "value",
    ["effusion_s58956720_positive_0", "02aa804e-bde0afdd-112c0b34-7bc16630-4e384014", "p10", "right lung"],
)
def test_real_names_pass(value):
    assert name_problem(value) is None and relative_problem(value) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("../../../../outside/credentials.txt", "'..' part"),
        ("contour_eval_qa/../../../x.png", "'..' part"),
        ("/etc/passwd", "absolute"),
        ("C:/Windows/x.png", "drive letter"),
        ("~/x.png", "home folder"),
        ("a//b.png", "empty part"),
        ("a/b/", "empty part"),
        ("a/./b.png", "'.' part"),
        ("..%2f..%2fx.png", "percent-encoded"),
        ("%2e%2e/x.png", "percent-encoded"),
        ("..\\..\\x.png", "backslash"),
        ("\uff0e\uff0e/x.png", "U+FF0E"),
        ("a.png\x00.txt", "NUL"),
        ("", "empty"),
    ],
)
def test_unsafe_relative_paths_are_refused(value, reason):
    problem = relative_problem(value)
    assert problem is not None and reason in problem


def test_links_are_followed(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.png").write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    os.symlink(outside / "secret.txt", tree / "sub" / "file-link.png")
    os.symlink(outside, tree / "dir-link")
    os.symlink(tree / "sub" / "a.png", tree / "inside-link.png")
    t = Tree(tree)
    assert "outside" in t.problem("sub/file-link.png")
    assert "outside" in t.problem("dir-link/secret.txt")
    assert "outside" in t.problem("dir-link/not-there.png")  # the folder link alone leaves the tree
    assert t.problem("inside-link.png") is None
    assert resolve_inside(tree, "inside-link.png") == (tree / "sub" / "a.png").resolve()
    assert t.problem("sub/missing.png") is None  # missing is not outside (reported as missing elsewhere)
    os.symlink(tree, tmp_path / "tree-link")  # the root itself may be a link
    assert Tree(tmp_path / "tree-link").problem("sub/a.png") is None


def test_output_paths_stay_under_the_output_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert output_path(out, "images/a/b.png") == out.resolve() / "images/a/b.png"
    with pytest.raises(ContainmentError, match="'..' part"):
        output_path(out, "images/../../escaped.png")
    with pytest.raises(ContainmentError, match="absolute"):
        output_path(out, "/tmp/escaped.png")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "images")
    with pytest.raises(ContainmentError, match="outside the output folder"):
        output_path(out, "images/b.png")
    os.symlink(elsewhere / "target.png", out / "file.png")  # a dangling link: writing would follow it
    with pytest.raises(ContainmentError, match="outside the output folder"):
        output_path(out, "file.png")


# ----------------------------------------------------------------------------------------- images
def _png_bytes(size=(8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, "gray").save(buf, format="PNG")
    return buf.getvalue()


def _jpeg_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "gray").save(buf, format="JPEG")
    return buf.getvalue()


def test_images_are_checked_by_their_bytes(tmp_path):
    (tmp_path / "ok.png").write_bytes(_png_bytes())
    (tmp_path / "jpeg.png").write_bytes(_jpeg_bytes())
    (tmp_path / "text.png").write_bytes(SECRET)
    gif = io.BytesIO()
    Image.new("P", (8, 8)).save(gif, format="GIF")
    (tmp_path / "gif.png").write_bytes(gif.getvalue())
    (tmp_path / "fake.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # magic, then no header
    assert image_data_url(tmp_path, "ok.png").startswith("data:image/png;base64,")
    jpeg = read_image(tmp_path, "jpeg.png")
    assert jpeg.mime == "image/jpeg" and jpeg.data_url().startswith("data:image/jpeg;base64,")
    assert image_file(tmp_path, "ok.png") == (tmp_path / "ok.png").resolve()
    with open_image(tmp_path, "jpeg.png") as im:
        assert im.format == "JPEG" and im.size == (8, 8)
    for name, reason in (
        ("text.png", "not a PNG or JPEG"),
        ("gif.png", "not a PNG or JPEG"),
        ("fake.png", "header does not parse"),
    ):
        for reader in (read_image, image_file, open_image, image_data_url):
            with pytest.raises(ContainmentError, match=reason):
                reader(tmp_path, name)
    with pytest.raises(FileNotFoundError):
        read_image(tmp_path, "missing.png")


def test_a_changed_file_is_checked_again(tmp_path):
    path = tmp_path / "x.png"
    path.write_bytes(_png_bytes())
    image_file(tmp_path, "x.png")
    path.write_bytes(SECRET)  # replaced after a first, successful check
    with pytest.raises(ContainmentError, match="not a PNG or JPEG"):
        image_file(tmp_path, "x.png")


# ------------------------------------------------------------------------------------- the bundle
def _entries(root):
    return json.loads((root / "chexpercept.json").read_text())


def _save(root, entries):
    (root / "chexpercept.json").write_text(json.dumps(entries, indent=2))


def _rr(entries):
    return next(
        k
        for k, e in entries.items()
        if "positive" in k and not e.get("contour_qa", {}).get("no_deformation", True)
    )


def _outside(tmp_path):
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    (out / "credentials.txt").write_bytes(SECRET)
    return out


def test_an_image_is_sent_as_exactly_the_base64_of_its_bytes(tmp_path):
    """The fast encoder gives RFC 4648 base64, padded, the very bytes of the standard library's, for
    every length modulo 3 and a radiograph-sized file."""
    import random

    rng = random.Random(0)
    png = _png_bytes()
    for tail in (0, 1, 2, 3, 57, 58, 59, 1 << 20):
        data = png + rng.randbytes(tail)
        image = ImageBytes(tmp_path / "x.png", data, "PNG")
        assert image.base64() == base64.b64encode(data)
        assert image.data_url() == "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    (tmp_path / "ok.png").write_bytes(png)
    assert image_data_url(tmp_path, "ok.png") == "data:image/png;base64," + base64.b64encode(png).decode()


@pytest.mark.parametrize("check_images", ["none", "exists", "basic", "full"])
def test_the_issue_path_is_refused_at_validation(fresh_bundle, tmp_path, check_images):
    _outside(fresh_bundle.parent)
    entries = _entries(fresh_bundle)
    key = _rr(entries)
    rel = "../../../../outside/credentials.txt"
    entries[key]["contour_qa"]["contour_eval_qa"]["relative_path"] = rel
    # the same path in a revision option too: every field is named
    entries[key]["contour_qa"]["contour_revision_qa_revision_result"]["answer_options"][0][
        "relative_path"
    ] = "/etc/passwd"
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, check_images=check_images)
    msg = str(e.value)
    assert f"{key}: contour_qa.contour_eval_qa.relative_path: refused: '{rel}' has a '..' part" in msg
    assert (
        f"{key}: contour_qa.contour_revision_qa_revision_result.answer_options[0].relative_path: "
        "refused: '/etc/passwd' is an absolute path"
    ) in msg


def test_validate_full_refuses_it(fresh_bundle, capsys):
    from chexpercept.cli import main as cli

    _outside(fresh_bundle.parent)
    entries = _entries(fresh_bundle)
    key = _rr(entries)
    entries[key]["contour_qa"]["contour_eval_qa"]["relative_path"] = "../../../../outside/credentials.txt"
    _save(fresh_bundle, entries)
    assert cli(["validate", str(fresh_bundle), "--full"]) == 1
    assert f"{key}: contour_qa.contour_eval_qa.relative_path: refused" in capsys.readouterr().err


@pytest.mark.parametrize(
    "relative",
    ["contour_eval_qa\\..\\..\\x.png", "..%2f..%2fx.png", "\uff0e\uff0e/x.png", "a.png\x00", "a//b.png"],
)
def test_encoded_forms_of_relative_path_are_refused(fresh_bundle, relative):
    entries = _entries(fresh_bundle)
    key = _rr(entries)
    entries[key]["contour_qa"]["contour_eval_qa"]["relative_path"] = relative
    _save(fresh_bundle, entries)
    with pytest.raises(
        BundleValidationError, match=rf"{key}: contour_qa.contour_eval_qa.relative_path: refused"
    ):
        read_bundle(fresh_bundle, check_images="none")


@pytest.mark.parametrize("value", ["../x", "/abs", "", ".", "a/b", "x\\y"])
@pytest.mark.parametrize("field", ["dicom_id", "pair_id"])
def test_ids_used_as_path_parts_are_refused(fresh_bundle, field, value):
    entries = _entries(fresh_bundle)
    key = next(k for k in entries if "negative" in k)
    entries[key][field] = value
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, check_images="none")
    assert f"{key}: {field}: " in str(e.value)


@pytest.mark.parametrize("suffix", ["/../../outside", "/..", "_a/../../b", "\\..\\x"])
def test_key_ids_used_as_path_parts_are_refused(fresh_bundle, suffix):
    entries = _entries(fresh_bundle)
    key = next(k for k in entries if "negative" in k)
    bad = key + suffix
    entries[bad] = entries.pop(key)
    entries[bad]["pair_id"] = bad.split("_", 1)[1]
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, check_images="none")
    assert f"{bad}: key_id: refused as a path part" in str(e.value)


@pytest.mark.parametrize("check_images", ["none", "exists", "basic"])
def test_a_file_link_out_of_the_bundle_is_refused(fresh_bundle, check_images):
    outside = _outside(fresh_bundle.parent)
    key = next(k for k in _entries(fresh_bundle) if "negative" in k)
    image = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    png = fresh_bundle.parent / "outside" / "real.png"
    png.write_bytes(image.read_bytes())  # a valid image, but another patient's, outside the bundle
    image.unlink()
    os.symlink(png, image)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, check_images=check_images)
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png: refused: resolves to {png.resolve()}" in str(
        e.value
    )
    assert str(outside.resolve()) in str(e.value)


def test_a_folder_link_out_of_the_bundle_is_refused(fresh_bundle):
    import shutil

    key = _rr(_entries(fresh_bundle))
    case_dir = fresh_bundle / "chexpercept" / key
    moved = fresh_bundle.parent / "elsewhere" / key
    shutil.move(str(case_dir), str(moved))
    os.symlink(moved, case_dir)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, check_images="none")
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png: refused: resolves to" in str(e.value)
    assert len({p.key_id for p in e.value.problems}) == 1  # that case only, each of its images named


def test_links_inside_the_bundle_and_a_linked_bundle_are_fine(fresh_bundle, tmp_path):
    entries = _entries(fresh_bundle)
    keys = [k for k in entries if "negative" in k][:2]
    a = fresh_bundle / "chexpercept" / keys[0] / "detection_qa" / "xray.png"
    b = fresh_bundle / "chexpercept" / keys[1] / "detection_qa" / "xray.png"
    b.unlink()
    os.symlink(os.path.relpath(a, b.parent), b)  # deduplicated release: a relative link inside
    os.symlink(fresh_bundle, tmp_path / "bundle-link")
    assert len(read_bundle(tmp_path / "bundle-link", check_images="full")) == len(entries)


@pytest.mark.parametrize(("content", "reason"), [(SECRET, "does not decode as PNG or JPEG"), ("gif", "GIF")])
def test_non_images_behind_an_image_name_are_refused(fresh_bundle, content, reason):
    key = next(k for k in _entries(fresh_bundle) if "negative" in k)
    image = fresh_bundle / "chexpercept" / key / "detection_qa" / "xray.png"
    if content == "gif":
        Image.new("P", (32, 32)).save(image, format="GIF")
        reason = "does not decode as PNG or JPEG: the file starts with b'GIF8"
    else:
        image.write_bytes(content)
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle)
    assert f"{key}: chexpercept/{key}/detection_qa/xray.png: image {reason}" in str(e.value)


def test_sha256sums_lines_that_leave_the_bundle_are_refused_unread(fresh_bundle):
    from chexpercept.bundle import write_sha256sums

    _outside(fresh_bundle.parent)
    sums = write_sha256sums(fresh_bundle)
    with open(sums, "a") as f:
        f.write("0" * 64 + "  ../outside/credentials.txt\n")
        f.write("0" * 64 + "  /etc/hostname\n")
    with pytest.raises(BundleValidationError) as e:
        read_bundle(fresh_bundle, verify_checksums=True)
    msg = str(e.value)
    assert (
        "SHA256SUMS.txt: ../outside/credentials.txt: refused: '../outside/credentials.txt' has a '..' part"
        in msg
    )
    assert "SHA256SUMS.txt: /etc/hostname: refused" in msg and "sha256 does not match" not in msg


# ------------------------------------------------------------------------------- datasets builder
def test_load_dataset_refuses_before_embedding(fresh_bundle):
    import datasets

    import chexpercept  # noqa: F401 - registers the builder

    _outside(fresh_bundle.parent)
    entries = _entries(fresh_bundle)
    key = _rr(entries)
    entries[key]["contour_qa"]["contour_eval_qa"]["relative_path"] = "../../../../outside/credentials.txt"
    _save(fresh_bundle, entries)
    with pytest.raises(BundleValidationError, match="relative_path: refused"):
        datasets.load_dataset(
            "chexpercept", data_dir=str(fresh_bundle), embed_images=True, check_images="none"
        )


def test_the_builder_checks_each_image_it_embeds(fresh_bundle):
    """A file swapped after validation (or never validated) is still refused when embedded."""
    from chexpercept_dataset import Chexpercept

    builder = Chexpercept(config_name="sequences", data_dir=str(fresh_bundle), embed_images=True)
    key = next(k for k in _entries(fresh_bundle) if "negative" in k)
    rel = f"chexpercept/{key}/detection_qa/xray.png"
    assert builder._image(str(fresh_bundle), rel)["bytes"][:4] == b"\x89PNG"
    (fresh_bundle / rel).write_bytes(SECRET)
    with pytest.raises(ContainmentError, match="not a PNG or JPEG"):
        builder._image(str(fresh_bundle), rel)
    with pytest.raises(ContainmentError, match="'..' part"):
        builder._image(str(fresh_bundle), "chexpercept/../../outside/credentials.txt")


# --------------------------------------------------------------------------------------- backends
def _swap_for_secret(bundle_root, key):
    """The detection image of ``key`` replaced, after validation, by a text file (and a link out)."""
    rel = f"chexpercept/{key}/detection_qa/xray.png"
    (bundle_root / rel).write_bytes(SECRET)
    return rel


@pytest.mark.parametrize("image_urls", ["data", "file"])
def test_openai_backend_never_sends_a_non_image_or_an_outside_file(fresh_bundle, image_urls):
    """With data URLs the file's bytes, with file URLs its name for the server to read: neither for
    a file that is not an image or lies outside the bundle."""
    from chexpercept.eval.protocol import RunContext

    from .fake_openai import FakeServer, backend_for, run_cases

    bundle = read_bundle(fresh_bundle, lesions=["effusion"], paths=["LF"])
    key = bundle.cases[0].key_id
    rel = _swap_for_secret(fresh_bundle, key)
    with FakeServer(local_media=fresh_bundle) as server:
        backend = backend_for(server, image_urls=image_urls)
        backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
        with pytest.raises(ContainmentError, match="not a PNG or JPEG"):
            backend.image_url(rel)
        with pytest.raises(ContainmentError, match="'..' part"):
            backend.image_url("chexpercept/../../outside/credentials.txt")
        with contextlib.suppress(Exception):  # the engine decides how the case ends; the API sees nothing
            run_cases(backend, bundle)
    sent = json.dumps([r["body"] for r in server.requests])
    assert rel not in sent and "outside" not in sent
    assert base64.b64encode(SECRET).decode() not in sent and "data:text/plain" not in sent
    assert SECRET.decode().strip() not in sent


def test_openai_backend_takes_the_mime_type_from_the_bytes(fixture_bundle, tmp_path):
    from chexpercept.eval.protocol import RunContext

    from .fake_openai import FakeServer, backend_for

    (tmp_path / "chexpercept").mkdir()
    (tmp_path / "chexpercept" / "x.png").write_bytes(_jpeg_bytes())
    with FakeServer() as server:
        backend = backend_for(server)
        backend.setup(RunContext(root=tmp_path, cases=[]))
        assert backend.image_url("chexpercept/x.png").startswith("data:image/jpeg;base64,")


def test_vllm_backend_hands_only_contained_images(fresh_bundle):
    from chexpercept.eval.protocol import RunContext

    from .test_eval_vllm import make_backend

    bundle = read_bundle(fresh_bundle, lesions=["effusion"], paths=["LF"])
    backend = make_backend()
    backend.setup(RunContext(root=bundle.root, cases=bundle.cases))
    key = bundle.cases[0].key_id
    rel = f"chexpercept/{key}/detection_qa/xray.png"
    assert backend.image_url(rel) == (fresh_bundle / rel).resolve().as_uri()
    os.symlink(fresh_bundle / rel, fresh_bundle.parent / "linked.png")
    with pytest.raises(ContainmentError, match="'..' part"):
        backend.image_url("chexpercept/../../linked.png")
    _swap_for_secret(fresh_bundle, key)
    with pytest.raises(ContainmentError, match="not a PNG or JPEG"):
        backend.image_url(rel)


def test_transformers_backend_decodes_only_contained_images(fresh_bundle):
    from chexpercept.eval.backends.transformers.backend import TransformersBackend
    from chexpercept.eval.protocol import BackendError, Sampling
    from chexpercept.eval.registry import resolve

    bundle = read_bundle(fresh_bundle, lesions=["effusion"], paths=["LF"])
    backend = TransformersBackend(
        resolve("medgemma-4b", backend="transformers"), sampling=Sampling(0.0, 1.0, 2, True)
    )
    backend.root = str(bundle.root)  # what setup sets, without loading a model
    key = bundle.cases[0].key_id
    rel = f"chexpercept/{key}/detection_qa/xray.png"
    assert backend._decode(rel).mode == "RGB"
    with pytest.raises(BackendError, match="'..' part"):
        backend._decode("chexpercept/../../outside/credentials.txt")
    _swap_for_secret(fresh_bundle, key)
    with pytest.raises(BackendError, match="not a PNG or JPEG"):
        backend._decode(rel)


# ----------------------------------------------------------------------------------------- report
def _report_workspace(root):
    from chexpercept.metrics.report.simulate import simulate_run
    from chexpercept.testing import write_fixture_bundle

    bundle_dir = write_fixture_bundle(root / "bundle", per_cell=1, lesions=("effusion",), image_size=16)
    simulate_run(read_bundle(bundle_dir, check_images="none"), root / "runs", "steady", accuracy=0.5)
    return bundle_dir


def test_report_embed_images_refuses_a_tampered_bundle_before_writing(tmp_path):
    from chexpercept.cli import main as cli

    bundle_dir = _report_workspace(tmp_path)
    _outside(tmp_path)
    entries = _entries(bundle_dir)
    key = _rr(entries)
    # the issue's shape: a path that climbs out of the report's images/ folder as well
    entries[key]["contour_qa"]["contour_eval_qa"]["relative_path"] = "../../../../outside/credentials.txt"
    _save(bundle_dir, entries)
    out = tmp_path / "nested" / "report"
    rc = cli(
        [
            *("report", "--results", str(tmp_path / "runs"), "--data-dir", str(bundle_dir)),
            *("--output-dir", str(out), "--embed-images", "--bootstrap", "0", "--no-plots"),
        ]
    )
    assert rc == 2
    assert not out.exists() and sorted(p.name for p in (tmp_path / "outside").iterdir()) == [
        "credentials.txt"
    ]


def test_report_linker_checks_each_image_and_each_copy(tmp_path):
    from chexpercept.metrics.report.cases import _ImageLinker

    bundle_dir = _report_workspace(tmp_path)
    key = next(k for k in _entries(bundle_dir) if "negative" in k)
    rel = f"chexpercept/{key}/detection_qa/xray.png"
    out = tmp_path / "report"
    out.mkdir()
    link = _ImageLinker(bundle_dir, out, embed=True)
    assert link(rel)["src"] == f"images/{rel}" and (out / "images" / rel).is_file()
    # a link planted after validation: refused, nothing copied
    outside = _outside(tmp_path)
    other = f"chexpercept/{key}/detection_qa/planted.png"
    os.symlink(outside / "credentials.txt", bundle_dir / other)
    with pytest.raises(ContainmentError, match="outside"):
        link(other)
    with pytest.raises(ContainmentError, match="'..' part"):
        link(f"chexpercept/{key}/../../../outside/credentials.txt")
    # a non-image inside the bundle is not copied into a report meant to be shared
    (bundle_dir / f"chexpercept/{key}/detection_qa/notes.png").write_bytes(SECRET)
    with pytest.raises(ContainmentError, match="not a PNG or JPEG"):
        link(f"chexpercept/{key}/detection_qa/notes.png")
    # the report's images/ folder replaced by a link elsewhere: nothing is written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    import shutil

    shutil.rmtree(out / "images")
    os.symlink(elsewhere, out / "images")
    with pytest.raises(ContainmentError, match="outside the output folder"):
        _ImageLinker(bundle_dir, out, embed=True)(rel)
    assert list(elsewhere.iterdir()) == []
