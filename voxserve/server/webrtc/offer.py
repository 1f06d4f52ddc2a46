"""The structure of a WebRTC offer, checked before aiortc sees it (server/webrtc/peer.py).

aiortc parses what it is given and trusts the rest: an m-line left out of the BUNDLE group,
or a second data channel m-line, failed inside `createAnswer` (a 500), and an offer with no
DTLS fingerprint was answered and then failed an assertion in a task nobody awaited. So an
offer is held here to what a browser sends and a call can use, every rule a clear
`invalid_sdp`: text lines of `<letter>=<value>` without control characters; m-lines of
audio (at least one), video, and exactly one `application` (the data channel, over SCTP);
every m-line with one `a=mid`, unique; one BUNDLE group at most, naming every m-line once;
on every m-line (or the session, which it inherits) ICE credentials of RFC 8839's form,
at least one DTLS fingerprint of an algorithm aiortc verifies and every fingerprint well
formed, and `a=setup` of actpass, active or passive. Pure: text in, VoxError out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from voxserve.errors import ErrorCode, VoxError

LINE = re.compile(r"[a-z]=.*")
MEDIA = re.compile(r"m=(\S+) (\d+)(?:/\d+)? (\S+)(?: (.+))?")
# RFC 5888 identification-tag is a token; bounded so a message quoting it stays short.
MID = re.compile(r"[A-Za-z0-9!#$%&'*+\-.^_`{|}~]{1,32}")
ICE_CHARS = re.compile(r"[A-Za-z0-9+/]+")
UFRAG_LEN, PWD_LEN = (4, 256), (22, 256)  # RFC 8839 section 5.4
# What aiortc checks a peer certificate with (rtcdtlstransport.X509_DIGEST_ALGORITHMS): an
# offer must name at least one; others are allowed (and ignored) if well formed.
DIGEST_BYTES = {"sha-256": 32, "sha-384": 48, "sha-512": 64}
FINGERPRINT = re.compile(r"([0-9A-Fa-f]{2})(:[0-9A-Fa-f]{2}){15,63}")
SETUP = ("actpass", "active", "passive")
KINDS = ("audio", "video", "application")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def invalid_sdp(message: str) -> VoxError:
    return VoxError(ErrorCode.INVALID_SDP, message)


@dataclass
class _Section:
    """The attributes that matter here of the session or one m-line."""

    kind: str = ""
    profile: str = ""
    formats: str = ""
    mids: list[str] = field(default_factory=list)
    ufrag: list[str] = field(default_factory=list)
    pwd: list[str] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)

    def take(self, line: str) -> None:
        name, _, value = line[2:].partition(":")
        value = value.strip()
        lists = {
            "mid": self.mids,
            "ice-ufrag": self.ufrag,
            "ice-pwd": self.pwd,
            "fingerprint": self.fingerprints,
            "setup": self.setup,
            "group": self.groups,
        }
        if name in lists:
            lists[name].append(value)


def _sections(text: str) -> tuple[_Section, list[_Section]]:
    if _CONTROL.search(text):
        raise invalid_sdp("the SDP offer holds control characters")
    lines = [line for line in text.replace("\r\n", "\n").split("\n") if line]
    session, media = _Section(), []
    current = session
    for number, line in enumerate(lines, 1):
        if LINE.fullmatch(line) is None:
            raise invalid_sdp(f"line {number} of the SDP offer is not <letter>=<value>")
        if line.startswith("m="):
            m = MEDIA.fullmatch(line)
            if m is None or int(m.group(2)) > 65_535:
                raise invalid_sdp(f"line {number} of the SDP offer is not an m-line SDP knows")
            current = _Section(kind=m.group(1), profile=m.group(3), formats=m.group(4) or "")
            media.append(current)
        elif line.startswith("a="):
            current.take(line)
    return session, media


def _one(values: list[str], inherited: list[str], what: str, where: str) -> str:
    taken = values or inherited
    if not taken:
        raise invalid_sdp(f"the SDP offer's {where} has no {what}")
    if len(set(taken)) > 1:
        raise invalid_sdp(f"the SDP offer's {where} has more than one {what}")
    return taken[0]


def _check_ice(section: _Section, session: _Section, where: str) -> None:
    ufrag = _one(section.ufrag, session.ufrag, "a=ice-ufrag", where)
    pwd = _one(section.pwd, session.pwd, "a=ice-pwd", where)
    for value, what, (low, high) in ((ufrag, "ice-ufrag", UFRAG_LEN), (pwd, "ice-pwd", PWD_LEN)):
        if not low <= len(value) <= high or ICE_CHARS.fullmatch(value) is None:
            raise invalid_sdp(
                f"the SDP offer's {where} has an a={what} that is not {low} to {high} "
                "letters, digits, + or /"
            )


def _check_dtls(section: _Section, session: _Section, where: str) -> None:
    fingerprints = section.fingerprints or session.fingerprints
    if not fingerprints:
        raise invalid_sdp(f"the SDP offer's {where} has no a=fingerprint (DTLS needs one)")
    known = 0
    for each in fingerprints:
        algorithm, _, value = each.partition(" ")
        algorithm, value = algorithm.lower(), value.strip()
        if FINGERPRINT.fullmatch(value) is None:
            raise invalid_sdp(f"the SDP offer's {where} has an a=fingerprint that is not hex pairs")
        size = DIGEST_BYTES.get(algorithm)
        if size is not None:
            if (len(value) + 1) // 3 != size:
                raise invalid_sdp(
                    f"the SDP offer's {where} has a {algorithm} fingerprint of the wrong length"
                )
            known += 1
    if not known:
        raise invalid_sdp(
            f"the SDP offer's {where} has no fingerprint of {', '.join(DIGEST_BYTES)}"
        )
    setup = _one(section.setup, session.setup, "a=setup", where)
    if setup not in SETUP:
        raise invalid_sdp(
            f"the SDP offer's {where} has a=setup {setup[:16]!r}: not one of {', '.join(SETUP)}"
        )


def _check_bundle(session: _Section, mids: list[str]) -> None:
    bundles = [g.split()[1:] for g in session.groups if g.split()[:1] == ["BUNDLE"]]
    if not bundles:
        return  # each m-line on its own transport (at most MAX_MEDIA of them)
    if len(bundles) > 1:
        raise invalid_sdp("the SDP offer has more than one BUNDLE group")
    named = bundles[0]
    if len(set(named)) != len(named):
        raise invalid_sdp("the SDP offer's BUNDLE group names an m-line twice")
    if set(named) != set(mids):
        raise invalid_sdp(
            "the SDP offer's BUNDLE group must name every m-line's a=mid, and only those"
        )


def check_structure(text: str) -> None:
    """The offer's structure (module docstring); `invalid_sdp` naming the first fault."""
    session, media = _sections(text)
    if not media:
        raise invalid_sdp("the SDP offer has no m-line")
    mids: list[str] = []
    for index, section in enumerate(media):
        where = f"m-line {index + 1} ({section.kind[:16]})"
        if section.kind not in KINDS:
            raise invalid_sdp(f"the SDP offer's {where}: voxserve takes {', '.join(KINDS)} m-lines")
        if len(section.mids) != 1 or MID.fullmatch(section.mids[0]) is None:
            raise invalid_sdp(
                f"the SDP offer's {where} needs one a=mid (a token of 1 to 32 characters)"
            )
        mids.append(section.mids[0])
        _check_ice(section, session, where)
        _check_dtls(section, session, where)
    if len(set(mids)) != len(mids):
        raise invalid_sdp("the SDP offer has two m-lines with the same a=mid")
    applications = [s for s in media if s.kind == "application"]
    if len(applications) > 1:
        raise invalid_sdp(
            "the SDP offer has more than one application m-line: one data channel carries "
            "the events"
        )
    for section in applications:
        if "SCTP" not in section.profile or section.formats.split() != ["webrtc-datachannel"]:
            raise invalid_sdp(
                "the SDP offer's application m-line is not a WebRTC data channel over SCTP"
            )
    _check_bundle(session, mids)
