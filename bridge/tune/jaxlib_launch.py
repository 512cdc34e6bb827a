"""Launching a lowered kernel call directly, through jaxlib's own Triton kernel call, to time it.

A custom call's opaque (one config's ``TritonAnyKernelCall``, as a lowering embeds it) is handed
to the function jaxlib registers as the legacy ``triton_kernel_call`` target, with the device
pointers of the call's buffers and a stream of our own; driver events on that stream time the
launches. So a measured launch is exactly what the custom call does in a program (jaxlib parses
the same message, loads the same module image, zeroes the same outputs, allocates the same
global scratch and encodes the same TMA descriptors), and measuring compiles no program.

The driver is reached through ``ctypes``, by the names its vendor declares
(:class:`bridge.vendors.vendor.Driver`): the stream and events live in the device's primary
context, the one XLA uses, so the buffers of JAX arrays on that device are valid there. A launch
jaxlib refuses is reported as :class:`~bridge.exceptions.Unlaunchable`, without jaxlib's message,
which the legacy call keeps in a C++ object: the caller asks a compiled program for it.
"""

from __future__ import annotations

import ctypes
import functools
import socket
import threading
from collections.abc import Sequence
from typing import Any

from ..exceptions import Unlaunchable
from ..vendors.vendor import Driver, by_platform

#: the legacy call's status: jaxlib writes a failure into it; zeroed room for any layout
_STATUS_BYTES = 128
_KERNEL_CALL = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,  # the stream
    ctypes.POINTER(ctypes.c_void_p),  # the buffers: operands, then results
    ctypes.c_char_p,  # the opaque
    ctypes.c_size_t,
    ctypes.c_void_p,  # XlaCustomCallStatus*
)


@functools.cache
def _driver(platform: str) -> tuple[Driver, Any, Any]:
    """The driver API, its library and jaxlib's kernel call for ``platform``.

    Raises:
        Unlaunchable: the platform, its driver or jaxlib's legacy kernel call is missing.
    """
    vendor = by_platform(platform)
    api = vendor.driver if vendor is not None else None
    if api is None:
        raise Unlaunchable(f"no direct launches on {platform!r}")
    try:
        lib = ctypes.CDLL(api.library)
        from jax._src.lib import gpu_triton

        capsule = getattr(gpu_triton, api.jaxlib_triton).get_custom_call()
        get_name = ctypes.pythonapi.PyCapsule_GetName
        get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        address = get_pointer(capsule, get_name(capsule))
    except (OSError, ImportError, AttributeError, ValueError) as e:
        raise Unlaunchable(f"jaxlib's Triton kernel call is not reachable: {e}") from e
    if not address:
        raise Unlaunchable("jaxlib's Triton kernel call has no address")
    if not any(hasattr(lib, n) for n in api.event_elapsed):
        raise Unlaunchable(f"{api.library} has none of {', '.join(api.event_elapsed)}")
    _check(getattr(lib, api.init)(0), api.init)
    return api, lib, _KERNEL_CALL(address)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise Unlaunchable(f"{what} failed with driver error {result}")


@functools.cache
def lane(platform: str, ordinal: int) -> Lane:
    """The lane of GPU ``ordinal`` on ``platform`` (one per process: its stream and events are
    kept).

    Raises:
        Unlaunchable: direct launches are not possible there.
    """
    return Lane(platform, ordinal)


class Lane:
    """One GPU to launch on: its stream and events (in its primary context), and its name
    (host and PCI bus id: two lanes with one name are one GPU)."""

    def __init__(self, platform: str, ordinal: int) -> None:
        self.api, self.lib, self._call = _driver(platform)
        self.ordinal = ordinal
        self._local = threading.local()
        self._device = self._current()
        self.stream = self._handle(self.api.stream_create, 1)  # non-blocking
        self._start = self._handle(self.api.event_create, 0)
        self._end = self._handle(self.api.event_create, 0)
        bus = ctypes.create_string_buffer(64)
        found = getattr(self.lib, self.api.bus_id)(bus, 64, self._device)
        where = bus.value.decode(errors="replace").lower() if found == 0 else f"gpu{ordinal}"
        self.name = f"{socket.gethostname()}/{where}"

    def _current(self) -> Any:
        """Make this lane's device current in the calling thread; returns the device."""
        api, lib = self.api, self.lib
        device: Any = self.ordinal
        if api.device_get is not None:
            handle = ctypes.c_int()
            _check(getattr(lib, api.device_get)(ctypes.byref(handle), self.ordinal), api.device_get)
            device = handle
        if getattr(self._local, "ready", False):
            return device
        if api.primary_context is not None and api.set_context is not None:
            context = ctypes.c_void_p()
            retained = getattr(lib, api.primary_context)(ctypes.byref(context), device)
            _check(retained, api.primary_context)
            _check(getattr(lib, api.set_context)(context), api.set_context)
        elif api.set_device is not None:
            _check(getattr(lib, api.set_device)(self.ordinal), api.set_device)
        self._local.ready = True
        return device

    def _handle(self, function: str, flags: int) -> ctypes.c_void_p:
        handle = ctypes.c_void_p()
        _check(getattr(self.lib, function)(ctypes.byref(handle), flags), function)
        return handle

    def time(self, opaque: bytes, buffers: Sequence[int], count: int) -> float:
        """Seconds that ``count`` back-to-back launches of the call ``opaque`` on ``buffers``
        (device pointers, operands then results) take on this lane.

        Raises:
            Unlaunchable: jaxlib refused the call (its message is not available here).
        """
        self._current()
        lib, api = self.lib, self.api
        pointers = (ctypes.c_void_p * max(1, len(buffers)))(*buffers)
        status = ctypes.create_string_buffer(_STATUS_BYTES)
        _check(getattr(lib, api.event_record)(self._start, self.stream), api.event_record)
        for _ in range(count):
            self._call(self.stream, pointers, opaque, len(opaque), ctypes.addressof(status))
            if any(status.raw):
                getattr(lib, api.stream_synchronize)(self.stream)
                raise Unlaunchable("jaxlib could not launch the kernel")
        _check(getattr(lib, api.event_record)(self._end, self.stream), api.event_record)
        _check(getattr(lib, api.event_synchronize)(self._end), api.event_synchronize)
        millis = ctypes.c_float()
        name = next(n for n in api.event_elapsed if hasattr(lib, n))
        _check(getattr(lib, name)(ctypes.byref(millis), self._start, self._end), name)
        return millis.value / 1e3
