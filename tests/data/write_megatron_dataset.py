#!/usr/bin/env python3
"""Writes a Megatron-LM mmap indexed dataset (PREFIX.bin + PREFIX.idx, magic MMIDIDX) for
jumbo's tests, from the format's published description, independently of jumbo's reader.

PREFIX.idx, little endian: magic b"MMIDIDX\\x00\\x00"; uint64 version (1); uint8 dtype code;
uint64 sequence_count; uint64 document_count (= documents + 1); int32
sequence_lengths[sequence_count]; int64 sequence_pointers[sequence_count] (byte offsets into
the .bin); int64 document_indices[document_count] (doc i = sequences [di[i], di[i+1]));
optionally int8 sequence_modes[sequence_count]. PREFIX.bin: the sequences' tokens back to back.

Usage: write_megatron_dataset.py PREFIX DOCUMENTS.json [--dtype NAME] [--version N]
           [--sequence-modes M,M,...] [--corrupt FIELD]
DOCUMENTS.json: a list of documents, each a list of sequences, each a list of token ids.
--corrupt damages one field after writing a valid pair, for the reader's error tests.
Standard library only (no numpy).
"""
import argparse
import json
import struct
import sys

# Megatron's DType codes with the struct format of one token.
DTYPES = {
    "uint8": (1, "B"),
    "int8": (2, "b"),
    "int16": (3, "h"),
    "int32": (4, "i"),
    "int64": (5, "q"),
    "float64": (6, "d"),
    "float32": (7, "f"),
    "uint16": (8, "H"),
}
MAGIC = b"MMIDIDX\x00\x00"
CORRUPTIONS = ("magic", "truncate-idx", "truncate-bin", "pointer", "document-index",
               "negative-length")


def build(documents, dtype, version, sequence_modes):
    code, token_format = DTYPES[dtype]
    itemsize = struct.calcsize("<" + token_format)
    lengths, pointers, document_indices = [], [], [0]
    bin_bytes = bytearray()
    for document in documents:
        for sequence in document:
            pointers.append(len(bin_bytes))
            lengths.append(len(sequence))
            bin_bytes += struct.pack("<%d%s" % (len(sequence), token_format), *sequence)
        document_indices.append(len(lengths))
    assert len(bin_bytes) == sum(lengths) * itemsize

    idx = bytearray(MAGIC)
    idx += struct.pack("<Q", version)
    idx += struct.pack("<B", code)
    idx += struct.pack("<Q", len(lengths))
    idx += struct.pack("<Q", len(document_indices))
    fields = {"sequence_lengths": len(idx)}
    idx += struct.pack("<%di" % len(lengths), *lengths)
    fields["sequence_pointers"] = len(idx)
    idx += struct.pack("<%dq" % len(pointers), *pointers)
    fields["document_indices"] = len(idx)
    idx += struct.pack("<%dq" % len(document_indices), *document_indices)
    if sequence_modes is not None:
        if len(sequence_modes) != len(lengths):
            sys.exit("--sequence-modes: %d modes for %d sequences" % (len(sequence_modes),
                                                                       len(lengths)))
        idx += struct.pack("<%db" % len(sequence_modes), *sequence_modes)
    return idx, bin_bytes, fields, itemsize, len(lengths), len(document_indices)


def corrupt(field, idx, bin_bytes, fields, itemsize, sequence_count, document_count):
    if field == "magic":
        idx[0:9] = b"NOTMEGAT\x00"
    elif field == "truncate-idx":
        del idx[-5:]
    elif field == "truncate-bin":
        del bin_bytes[-itemsize:]
    elif field == "pointer":  # the last sequence starts one token late
        assert sequence_count >= 2, "pointer: needs two sequences"
        at = fields["sequence_pointers"] + 8 * (sequence_count - 1)
        (pointer,) = struct.unpack_from("<q", idx, at)
        struct.pack_into("<q", idx, at, pointer + itemsize)
    elif field == "document-index":  # document_indices[1] above document_indices[2]
        assert document_count >= 3, "document-index: needs two documents"
        at = fields["document_indices"] + 8
        first, second = struct.unpack_from("<2q", idx, at)
        assert first < second, "document-index: documents 0 and 1 must not be empty"
        struct.pack_into("<2q", idx, at, second, first)
    elif field == "negative-length":
        assert sequence_count >= 1, "negative-length: needs a sequence"
        struct.pack_into("<i", idx, fields["sequence_lengths"], -1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prefix")
    parser.add_argument("documents", help="JSON file: [[[token, ...], ...], ...]")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="int32")
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--sequence-modes", help="comma-separated int8 mode per sequence")
    parser.add_argument("--corrupt", choices=CORRUPTIONS)
    args = parser.parse_args()

    with open(args.documents) as f:
        documents = json.load(f)
    modes = None
    if args.sequence_modes is not None:
        modes = [int(m) for m in args.sequence_modes.split(",") if m != ""]
    idx, bin_bytes, fields, itemsize, sequence_count, document_count = build(
        documents, args.dtype, args.version, modes)
    if args.corrupt:
        corrupt(args.corrupt, idx, bin_bytes, fields, itemsize, sequence_count, document_count)
    with open(args.prefix + ".bin", "wb") as f:
        f.write(bin_bytes)
    with open(args.prefix + ".idx", "wb") as f:
        f.write(idx)


if __name__ == "__main__":
    main()
