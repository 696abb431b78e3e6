"""Instance-local memory substrate: bump layout, host KV registry (HKVR), D2D staging, switching.

Bookkeeping modules (layout, pages, staging, slabs, hkvr, transfer, kv_layout, models) are pure;
bytes move through `device.Device`, implemented over torch in `torch_device` (imported lazily).
"""

from talariad.memory.device import CopyEvent, Device
from talariad.memory.hkvr import BlockState, HostKVRegistry, PrefixAgreement, prefix_hashes
from talariad.memory.kv_layout import KVGeometry, KVLayout
from talariad.memory.layout import BumpLayout, Region
from talariad.memory.staging import ChunkState, GatherPlan, StagingBitmap
from talariad.memory.substrate import RestoreResult, Substrate, SubstrateConfig
from talariad.memory.switch import PointerCheck, SwitchTiming, switch_all

__all__ = [
    "BlockState",
    "BumpLayout",
    "ChunkState",
    "Device",
    "CopyEvent",
    "GatherPlan",
    "HostKVRegistry",
    "KVGeometry",
    "KVLayout",
    "PointerCheck",
    "PrefixAgreement",
    "Region",
    "RestoreResult",
    "StagingBitmap",
    "Substrate",
    "SubstrateConfig",
    "SwitchTiming",
    "prefix_hashes",
    "switch_all",
]
