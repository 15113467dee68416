#!/usr/bin/env python3
"""Writes the hwloc XML fixtures of tests/topo (run once; the XML is committed).

node4gpu2nic.xml: 2 packages x 8 cores; per package one PCIe switch with
  2 NVIDIA GPUs (class 0302) and 1 Mellanox NIC (mlx5_N + ibN). Package 0 also
  has an ASPEED VGA (vendor 1a03, class 0300: not a GPU) and an NVMe disk.
node8gpu4nic.xml: 2 packages x 16 cores; per package two switches, each with
  2 GPUs and 1 NIC. GPU 5 carries no CUDA OS device (found by PCI id alone),
  NIC 3 carries only an Ethernet OS device (no openfabrics name).
"""
import sys

gp = [100]


def nid():
    gp[0] += 1
    return gp[0]


def mask(lo, n):
    return "0x%08x" % (((1 << n) - 1) << lo)


def pcidev(busid, cls, vendor, device, osdevs, ind):
    s = ind + ('<object type="PCIDev" gp_index="%d" pci_busid="%s" '
               'pci_type="%04x [%04x:%04x] [%04x:0000] a1" pci_link_speed="15.753846">\n'
               % (nid(), busid, cls, vendor, device, vendor))
    for name, ostype, subtype in osdevs:
        sub = ' subtype="%s"' % subtype if subtype else ""
        s += ind + '  <object type="OSDev" gp_index="%d" name="%s"%s osdev_type="%d"/>\n' % (
            nid(), name, sub, ostype)
    return s + ind + "</object>\n"


def switch(dom_bus, sec, devs, ind):
    s = ind + ('<object type="Bridge" gp_index="%d" bridge_type="1-1" depth="1" '
               'bridge_pci="0000:[%02x-%02x]" pci_busid="0000:%02x:01.0" '
               'pci_type="0604 [10b5:c010] [10b5:c010] b0" pci_link_speed="15.753846">\n'
               % (nid(), sec, sec, dom_bus))
    for d in devs:
        s += d
    return s + ind + "</object>\n"


def gpu(bus, slot, cuda):
    osd = [("cuda%d" % cuda, 5, "CUDA"), ("nvml%d" % cuda, 1, "NVML")] if cuda is not None else []
    return pcidev("0000:%02x:%02x.0" % (bus, slot), 0x0302, 0x10DE, 0x2330, osd, " " * 10)


def nic(bus, slot, idx, ib=True):
    osd = [("ib%d" % idx, 2, None), ("mlx5_%d" % idx, 3, None)] if ib else [
        ("eth%d" % idx, 2, None)]
    return pcidev("0000:%02x:%02x.0" % (bus, slot), 0x0207 if ib else 0x0200,
                  0x15B3, 0x101D, osd, " " * 10)


def package(p, ncores, cpu0, hostbridge, numa_mem):
    cs = mask(cpu0, ncores)
    s = ('    <object type="Package" os_index="%d" cpuset="%s" complete_cpuset="%s" '
         'nodeset="0x%x" complete_nodeset="0x%x" gp_index="%d">\n' % (p, cs, cs, 1 << p, 1 << p, nid()))
    s += ('      <object type="NUMANode" os_index="%d" cpuset="%s" complete_cpuset="%s" '
          'nodeset="0x%x" complete_nodeset="0x%x" gp_index="%d" local_memory="%d"/>\n'
          % (p, cs, cs, 1 << p, 1 << p, nid(), numa_mem))
    for c in range(ncores):
        m = mask(cpu0 + c, 1)
        s += ('      <object type="Core" os_index="%d" cpuset="%s" complete_cpuset="%s" '
              'nodeset="0x%x" complete_nodeset="0x%x" gp_index="%d">\n'
              '        <object type="PU" os_index="%d" cpuset="%s" complete_cpuset="%s" '
              'nodeset="0x%x" complete_nodeset="0x%x" gp_index="%d"/>\n      </object>\n'
              % (c, m, m, 1 << p, 1 << p, nid(), cpu0 + c, m, m, 1 << p, 1 << p, nid()))
    return s + hostbridge + "    </object>\n"


def hostbridge(lo, hi, children):
    s = ('      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" '
         'bridge_pci="0000:[%02x-%02x]">\n' % (nid(), lo, hi))
    for c in children:
        s += c
    return s + "      </object>\n"


def topology(host, ncpu, packages):
    cs = mask(0, ncpu)
    s = ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n'
         '<topology version="2.0">\n'
         '  <object type="Machine" os_index="0" cpuset="%s" complete_cpuset="%s" '
         'allowed_cpuset="%s" nodeset="0x3" complete_nodeset="0x3" allowed_nodeset="0x3" '
         'gp_index="1">\n' % (cs, cs, cs))
    s += '    <info name="HostName" value="%s"/>\n' % host
    s += '    <info name="Architecture" value="x86_64"/>\n'
    for p in packages:
        s += p
    return s + "  </object>\n</topology>\n"


def node4():
    gp[0] = 100
    sw0 = switch(0x00, 0x01, [gpu(0x01, 0, 0), gpu(0x01, 1, 1), nic(0x01, 2, 0)], " " * 8)
    vga = pcidev("0000:00:02.0", 0x0300, 0x1A03, 0x2000, [], " " * 8)
    nvme = pcidev("0000:00:03.0", 0x0108, 0x144D, 0xA80A, [("nvme0n1", 0, "Disk")], " " * 8)
    sw1 = switch(0x40, 0x41, [gpu(0x41, 0, 2), gpu(0x41, 1, 3), nic(0x41, 2, 1)], " " * 8)
    p0 = package(0, 8, 0, hostbridge(0x00, 0x01, [sw0, vga, nvme]), 1 << 36)
    p1 = package(1, 8, 8, hostbridge(0x40, 0x41, [sw1]), 1 << 36)
    return topology("gpu4-node", 16, [p0, p1])


def node8():
    gp[0] = 100
    pk = []
    g = 0
    n = 0
    for p in range(2):
        sws = []
        base = 0x40 * p
        for s in range(2):
            bus = base + 1 + s
            devs = []
            for k in range(2):
                devs.append(gpu(bus, k, None if g == 5 else g))
                g += 1
            devs.append(nic(bus, 2, n, ib=(n != 3)))
            n += 1
            sws.append(switch(base, bus, devs, " " * 8).replace(
                "pci_busid=\"0000:%02x:01.0\"" % base, "pci_busid=\"0000:%02x:%02x.0\"" % (base, s + 1)))
        pk.append(package(p, 16, 16 * p, hostbridge(base, base + 2, sws), 1 << 37))
    return topology("gpu8-node", 32, pk)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    open(out + "/node4gpu2nic.xml", "w").write(node4())
    open(out + "/node8gpu4nic.xml", "w").write(node8())
