package publish

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"wormhole/kubernetes/internal/wh"
)

func inventory(mem uint64) *wh.Inventory {
	inv := &wh.Inventory{}
	inv.APIs = append(inv.APIs, struct {
		API     string      `json:"api"`
		Devices []wh.Device `json:"devices"`
		Error   string      `json:"error,omitempty"`
	}{API: "opencl", Devices: []wh.Device{{Name: "H100", Vendor: "NVIDIA", Kind: "gpu", MemoryBytes: mem}}})
	return inv
}

func TestDevicesAreShareableWithWholeMiBOfMemory(t *testing.T) {
	p := Pool{Name: "gpu-1", Node: "node-a", Endpoint: "unix:///run/wormhole/wormhole.sock", Sessions: 8,
		DefaultMemory: resource.MustParse("256Mi")}
	res, notes := Resources(p, inventory(80<<30+12345))
	if len(notes) > 0 {
		t.Fatal(notes)
	}
	pool := res.Pools["gpu-1"]
	if pool.AllNodes || pool.NodeSelector == nil || pool.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0] != "node-a" {
		t.Fatalf("a node's pool is for that node only: %+v", pool)
	}
	d := pool.Slices[0].Devices[0]
	if d.Name != "opencl-0" || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Fatalf("device: %+v", d)
	}
	mem := d.Capacity[Memory]
	if got := mem.Value.Value(); got != 80<<30 {
		t.Fatalf("memory %d, want whole MiB (%d)", got, int64(80<<30))
	}
	if mem.RequestPolicy.Default.Cmp(resource.MustParse("256Mi")) != 0 || mem.RequestPolicy.ValidRange.Step.Cmp(Quantum) != 0 {
		t.Fatalf("request policy: %+v", mem.RequestPolicy)
	}
	if *d.Attributes["transport"].StringValue != "unix" || *d.Attributes["model"].StringValue != "H100" {
		t.Fatalf("attributes: %+v", d.Attributes)
	}
}

func TestOperatorCapsMemoryAndNetworkPoolsServeAllNodes(t *testing.T) {
	p := Pool{Name: "remote", Endpoint: "tls://10.0.0.5:7700", Sessions: 4,
		MemoryLimit: resource.MustParse("1Gi"), DefaultMemory: resource.MustParse("4Gi")}
	res, notes := Resources(p, inventory(80<<30))
	if len(notes) > 0 {
		t.Fatal(notes)
	}
	pool := res.Pools["remote"]
	if !pool.AllNodes || pool.NodeSelector != nil {
		t.Fatalf("a network pool serves all nodes: %+v", pool)
	}
	mem := pool.Slices[0].Devices[0].Capacity[Memory]
	if mem.Value.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Fatalf("memory %s, want the operator's 1Gi", mem.Value.String())
	}
	// A default above the capacity would make every default claim unallocatable.
	if mem.RequestPolicy.Default.Cmp(resource.MustParse("1Gi")) != 0 {
		t.Fatalf("default %s", mem.RequestPolicy.Default.String())
	}
}

func TestSmallDevicesAreLeftOutAndOddSettingsStayValid(t *testing.T) {
	p := Pool{Name: "x", Endpoint: "tcp://" + strings.Repeat("h", 70) + ":1", Sessions: 1,
		DefaultMemory: resource.MustParse("1.5Mi")}
	res, notes := Resources(p, inventory(1<<20))
	if len(notes) != 1 || len(res.Pools["x"].Slices[0].Devices) != 0 {
		t.Fatalf("a 1 MiB device is too small to share: %v", notes)
	}
	res, _ = Resources(p, inventory(64<<20))
	d := res.Pools["x"].Slices[0].Devices[0]
	if _, ok := d.Attributes["endpoint"]; ok {
		t.Fatal("an endpoint over 64 characters is no attribute")
	}
	sessions := d.Capacity[Sessions]
	if sessions.RequestPolicy != nil || sessions.Value.Value() != 1 {
		t.Fatalf("one session: %+v", d.Capacity[Sessions])
	}
	if def := d.Capacity[Memory].RequestPolicy.Default; def.Value() != 2<<20 {
		t.Fatalf("the default rounds up to whole MiB: %s", def.String())
	}
}
