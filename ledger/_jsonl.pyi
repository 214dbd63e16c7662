from typing_extensions import Buffer

def scan(data: Buffer, first_line: int, event_min: int, event_max: int, /) -> tuple[
    int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]: ...
