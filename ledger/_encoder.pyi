from typing_extensions import Buffer

def encode_records(n: int, key_off: Buffer, key_data: Buffer, key_valid: Buffer | None, value_off: Buffer,
                   value_data: Buffer, value_valid: Buffer | None, map_off: Buffer | None, map_valid: Buffer | None,
                   pkey_off: Buffer | None, pkey_data: Buffer | None, pvalue_off: Buffer | None,
                   pvalue_data: Buffer | None, event: Buffer | None, event_valid: Buffer | None, publish: int,
                   max_record: int, /
                   ) -> tuple[bytearray, bytearray, bytearray, bytearray, bytearray, bytearray] | tuple[int, int]: ...
