// Package publish turns a server's devices into the ResourceSlice pool the scheduler
// allocates from: each device shareable by many claims (allowMultipleAllocations), with its
// memory and sessions as consumable capacity, so claims are placed by how much they need and
// a device is never promised beyond what it has.
package publish

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"wormhole/kubernetes/internal/wh"
)

// Capacity names, as claims request them (`capacity.requests`).
const (
	Memory   resourceapi.QualifiedName = "memory"
	Sessions resourceapi.QualifiedName = "sessions"
)

// Pool says what one server offers and to whom.
type Pool struct {
	// Name of the pool (the server's name in the cluster).
	Name string
	// Node is the node the server runs on when only that node's pods may use it (local
	// socket); empty for a server reached over the network by every node (or by NodeSelector).
	Node string
	// NodeSelector limits a network pool to the nodes that can reach it (nil: all nodes).
	NodeSelector *v1.NodeSelector
	// Endpoint is where a tenant connects: unix:///path or tcp://host:port or tls://host:port.
	Endpoint string
	// MemoryLimit caps the memory published per device (0: the device's own), so an operator
	// can keep part of a device out of the pool.
	MemoryLimit resource.Quantity
	// Sessions is how many sessions one device may serve at once, over all claims.
	Sessions int64
	// DefaultMemory is what a claim that names no memory consumes.
	DefaultMemory resource.Quantity
}

// Quantum is the step memory requests are rounded up to: tenants' quotas are whole MiB.
var Quantum = resource.MustParse("1Mi")

// MinMemory is the least a device must offer to be published (a default share and one more).
var MinMemory = resource.MustParse("2Mi")

// Resources is the pool's one slice: every device of every API the server offers. Devices
// too small to share are left out, and said so in the returned notes.
func Resources(p Pool, inv *wh.Inventory) (*resourceslice.DriverResources, []string) {
	var devices []resourceapi.Device
	var notes []string
	for _, api := range inv.APIs {
		for i, d := range api.Devices {
			name := DeviceName(api.API, i)
			mem := *resource.NewQuantity(int64(d.MemoryBytes), resource.BinarySI)
			if !p.MemoryLimit.IsZero() && p.MemoryLimit.Cmp(mem) < 0 {
				mem = p.MemoryLimit
			}
			// Whole MiB, as quotas are.
			mem = *resource.NewQuantity(mem.Value()/Quantum.Value()*Quantum.Value(), resource.BinarySI)
			if mem.Cmp(MinMemory) < 0 {
				notes = append(notes, fmt.Sprintf("%s (%s) left out: %s of memory is too little to share", name, d.Name, mem.String()))
				continue
			}
			// The default share: whole MiB, at least one, at most the device.
			def := *resource.NewQuantity(max(roundUp(p.DefaultMemory.Value(), Quantum.Value()), Quantum.Value()), resource.BinarySI)
			if def.Cmp(mem) > 0 {
				def = mem
			}
			attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"api":       {StringValue: ptr.To(api.API)},
				"model":     {StringValue: ptr.To(clip(d.Name))},
				"vendor":    {StringValue: ptr.To(clip(d.Vendor))},
				"kind":      {StringValue: ptr.To(d.Kind)},
				"transport": {StringValue: ptr.To(transport(p.Endpoint))},
				"server":    {StringValue: ptr.To(clip(p.Name))},
			}
			// Attributes hold 64 characters: a longer endpoint is only in the grants.
			if len(p.Endpoint) <= 64 {
				attrs["endpoint"] = resourceapi.DeviceAttribute{StringValue: ptr.To(p.Endpoint)}
			}
			capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				Memory: {
					Value: mem,
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: &def,
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  ptr.To(Quantum),
							Step: ptr.To(Quantum),
						},
					},
				},
				// One session unless asked: a device of one session has no policy to give.
				Sessions: {Value: *resource.NewQuantity(max(p.Sessions, 1), resource.DecimalSI)},
			}
			if p.Sessions > 1 {
				one := resource.NewQuantity(1, resource.DecimalSI)
				c := capacity[Sessions]
				c.RequestPolicy = &resourceapi.CapacityRequestPolicy{
					Default:    one,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: one, Step: one},
				}
				capacity[Sessions] = c
			}
			devices = append(devices, resourceapi.Device{
				Name:                     name,
				Attributes:               attrs,
				Capacity:                 capacity,
				AllowMultipleAllocations: ptr.To(true),
			})
		}
	}
	pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: devices}}}
	switch {
	case p.Node != "":
		pool.NodeSelector = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchFields: []v1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{p.Node},
			}},
		}}}
	case p.NodeSelector != nil:
		pool.NodeSelector = p.NodeSelector
	default:
		pool.AllNodes = true
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{p.Name: pool}}, notes
}

// DeviceName is the name the i-th device of an API has in the pool's slice.
func DeviceName(api string, i int) string {
	return fmt.Sprintf("%s-%d", api, i)
}

func roundUp(v, q int64) int64 {
	return (v + q - 1) / q * q
}

// transport is the endpoint's scheme: unix, tcp or tls.
func transport(endpoint string) string {
	scheme, _, _ := strings.Cut(endpoint, "://")
	return scheme
}

// clip keeps a string attribute within the API's 64 characters.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
