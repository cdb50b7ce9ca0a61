"""Structural checks of ELF files before the dynamic loader or the JIT linker sees them.

Both trust the headers: a truncated shared library whose program headers point past the
end of the file is mapped anyway and dies with SIGBUS on first touch, and LLVM's JIT
linker aborts the process on a relocatable object whose sections lie outside it.  So
every header, program segment and section of a file is checked to lie inside it, the
file must be of the expected type for this machine, and a library must define the symbol
tracecomp will call as a function: a dynamic symbol of type STT_FUNC whose address lies in
an executable section (read from the file, not by loading it: a data symbol of that name
called through ctypes would be a jump into data, SIGSEGV).
These checks make damage an error; they do not make a hostile file safe (a well-formed
library runs whatever code it holds), which is what cache.py's HMAC and the exporter's
checksum are for.
"""
from __future__ import annotations

import platform
import struct
from typing import Sequence

from ..core.errors import BackendError

ET_REL, ET_DYN = 1, 3
SHT_NOBITS, SHT_DYNSYM = 8, 11
SHF_EXECINSTR = 0x4
STT_FUNC = 2
PT_LOAD = 1
MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}   # EM_X86_64, EM_AARCH64
EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
SHDR = struct.Struct("<IIQQQQIIQQ")
PHDR = struct.Struct("<IIQQQQQQ")
SYM = struct.Struct("<IBBHQQ")


class ElfError(BackendError):
    """A file that is not a well-formed ELF file of the expected kind (says what is wrong)."""


def check_object(data: bytes, what: str = "object") -> None:
    """A relocatable object (ET_REL) for this machine whose sections lie inside it."""
    header = _header(data, ET_REL, what)
    _sections(data, header, what)


def check_library(data: bytes, functions: Sequence[str], what: str = "library") -> None:
    """A shared library (ET_DYN) for this machine whose segments and sections lie inside
    the file and whose dynamic symbol table defines each of `functions` as a function in
    an executable section (checked in the order given: the first missing one is named)."""
    header = _header(data, ET_DYN, what)
    _, _, _, _, _, phoff, _, _, _, phentsize, phnum, _, _, _ = header
    if phnum == 0 or phentsize != PHDR.size:
        raise ElfError(f"{what}: no program headers of the ELF64 size")
    _inside(data, phoff, phnum * PHDR.size, what, "the program headers")
    for i in range(phnum):
        p_type, _, offset, _, _, filesz, _, _ = PHDR.unpack_from(data, phoff + i * PHDR.size)
        if p_type == PT_LOAD:
            _inside(data, offset, filesz, what, f"loadable segment {i}")
    sections = _sections(data, header, what)
    symbols = _dynamic_symbols(data, sections, what)
    for name in functions:
        _check_function(name, symbols.get(name, []), sections, what)


def _check_function(name: str, entries: list[tuple[int, int, int]], sections: list[tuple],
                    what: str) -> None:
    """Every definition of `name` ((type, section, value) triples) is a function inside an
    executable section; there is at least one."""
    if not entries:
        raise ElfError(f"{what}: its dynamic symbol table does not define '{name}'")
    for kind, shndx, value in entries:
        if kind != STT_FUNC:
            raise ElfError(f"{what}: '{name}' is a {_SYMBOL_KINDS.get(kind, f'type {kind}')} "
                           "symbol, not a function; tracecomp would call it")
        if shndx >= len(sections):
            raise ElfError(f"{what}: function '{name}' lies in section {shndx}, which the file "
                           f"does not have ({len(sections)} sections)")
        _, _, flags, addr, _, size, _, _, _, _ = sections[shndx]
        if not flags & SHF_EXECINSTR or not addr <= value < addr + size:
            raise ElfError(f"{what}: function '{name}' does not lie in executable code "
                           f"(section {shndx}, address {value:#x})")


_SYMBOL_KINDS = {0: "untyped", 1: "data (object)", 3: "section", 4: "file", 5: "common",
                 6: "thread-local", 10: "indirect-function (ifunc)"}


def _header(data: bytes, kind: int, what: str) -> tuple:
    if len(data) < EHDR.size or data[:4] != b"\x7fELF":
        raise ElfError(f"{what}: not an ELF file ({len(data)} bytes)")
    header = EHDR.unpack_from(data)
    ident, e_type, machine = header[0], header[1], header[2]
    if ident[4] != 2 or ident[5] != 1:
        raise ElfError(f"{what}: not a 64-bit little-endian ELF file")
    if e_type != kind:
        raise ElfError(f"{what}: ELF type {e_type}, expected {kind} "
                       f"({'a relocatable object' if kind == ET_REL else 'a shared library'})")
    expected = MACHINES.get(platform.machine().lower())
    if expected is not None and machine != expected:
        raise ElfError(f"{what}: built for ELF machine {machine}, this host is {platform.machine()}")
    return header


def _sections(data: bytes, header: tuple, what: str) -> list[tuple]:
    shoff, shentsize, shnum, shstrndx = header[6], header[11], header[12], header[13]
    if shnum == 0:
        if shoff:
            raise ElfError(f"{what}: section headers at {shoff} but a section count of 0")
        return []
    if shentsize != SHDR.size or shstrndx >= shnum:
        raise ElfError(f"{what}: malformed section header table")
    _inside(data, shoff, shnum * SHDR.size, what, "the section headers")
    sections = [SHDR.unpack_from(data, shoff + i * SHDR.size) for i in range(shnum)]
    for i, s in enumerate(sections):
        if s[1] != SHT_NOBITS:
            _inside(data, s[4], s[5], what, f"section {i}")
    return sections


def _dynamic_symbols(data: bytes, sections: list[tuple], what: str) -> dict[str, list]:
    """name -> [(type, section index, value)] of each symbol the dynamic symbol table
    defines (not those it imports)."""
    names: dict[str, list] = {}
    for s in sections:
        if s[1] != SHT_DYNSYM:
            continue
        if s[9] != SYM.size or s[6] >= len(sections):
            raise ElfError(f"{what}: malformed dynamic symbol table")
        strings = sections[s[6]]
        table = data[strings[4]:strings[4] + strings[5]]
        for k in range(s[5] // SYM.size):
            st_name, info, _, shndx, value, _ = SYM.unpack_from(data, s[4] + k * SYM.size)
            if shndx != 0 and st_name < len(table):          # defined here, not imported
                end = table.find(b"\0", st_name)
                name = table[st_name:end if end >= 0 else len(table)].decode("latin-1")
                names.setdefault(name, []).append((info & 0xF, shndx, value))
    return names


def _inside(data: bytes, offset: int, size: int, what: str, part: str) -> None:
    if offset + size > len(data):
        raise ElfError(f"{what}: {part} ({offset}+{size} bytes) lies past the end of the "
                       f"{len(data)}-byte file (truncated?)")
