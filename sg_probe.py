# scratch (not committed): the adapter's subgroup size and whether subgroups follow local_invocation_index
import numpy as np, wgpu
from tilecore_webgpu.runtime import select_adapter, device_for
a = select_adapter(""); dev = device_for(a); print(a.info["device"] if hasattr(a, "info") else a)
for wg in (64, 128, 256):
    code = f"""@group(0) @binding(0) var<storage, read_write> o: array<vec4<u32>>;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) s: u32, @builtin(subgroup_id) sid: u32, @builtin(num_subgroups) ns: u32) {{
  o[li] = vec4<u32>(lane, s, sid*s+lane, ns);
}}"""
    out = dev.create_buffer(size=wg*16, usage=wgpu.BufferUsage.STORAGE|wgpu.BufferUsage.COPY_SRC)
    p = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=code), "entry_point": "main"})
    bg = dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=[{"binding":0,"resource":{"buffer":out}}])
    enc = dev.create_command_encoder(); cp = enc.begin_compute_pass(); cp.set_pipeline(p); cp.set_bind_group(0,bg); cp.dispatch_workgroups(1); cp.end()
    dev.queue.submit([enc.finish()])
    r = np.frombuffer(dev.queue.read_buffer(out), dtype=np.uint32).reshape(wg,4)
    print(wg, "sizes", sorted(set(r[:,1].tolist())), "num_subgroups", r[0,3], "renumbering == local index:", bool((r[:,2]==np.arange(wg)).all()))
