"""What the first WebGPU adapter does with subgroups: the sizes it runs, and whether the subgroups follow
``local_invocation_index`` (``subgroup_id * subgroup_size + subgroup_invocation_id`` equal to it), for
one-dimensional workgroups of 64, 128 and 256 invocations.

    python scripts/webgpu_subgroup_probe.py

tilecore-webgpu relies on neither (decision D21: the kernel votes and renumbers at run time); this prints
what an adapter does, for the decision's record (lavapipe: 8, follows; NVIDIA Vulkan: 32, follows).
"""
from __future__ import annotations

import numpy as np
import wgpu

from tilecore_webgpu.runtime import adapter_info, device_for, select_adapter

SHADER = """@group(0) @binding(0) var<storage, read_write> o: array<vec4<u32>>;
@compute @workgroup_size({n})
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) s: u32, @builtin(subgroup_id) sid: u32, @builtin(num_subgroups) ns: u32) {{
  o[li] = vec4<u32>(lane, s, sid * s + lane, ns);
}}"""


def main() -> None:
    adapter = select_adapter("")
    dev = device_for(adapter)
    print(adapter_info(adapter))
    for n in (64, 128, 256):
        out = dev.create_buffer(size=n * 16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        pipe = dev.create_compute_pipeline(layout="auto", compute={
            "module": dev.create_shader_module(code=SHADER.format(n=n)), "entry_point": "main"})
        group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                      entries=[{"binding": 0, "resource": {"buffer": out}}])
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(1)
        cp.end()
        dev.queue.submit([enc.finish()])
        r = np.frombuffer(dev.queue.read_buffer(out), dtype=np.uint32).reshape(n, 4)
        print(f"{n} invocations: subgroup sizes {sorted(set(r[:, 1].tolist()))}, num_subgroups {int(r[0, 3])}, "
              f"subgroup_id * size + lane == local_invocation_index: {bool((r[:, 2] == np.arange(n)).all())}")


if __name__ == "__main__":
    main()
