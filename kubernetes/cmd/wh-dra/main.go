// wh-dra is Wormhole's Kubernetes DRA driver (resource.k8s.io/v1).
//
//	wh-dra controller      one per `wh serve`, beside it: publishes the server's devices as a
//	                       pool of shareable devices with consumable memory and sessions, and
//	                       keeps the server's tenants equal to the claims allocated from it.
//	wh-dra kubelet-plugin  one per node: hands a pod's containers the token of their claim,
//	                       where to connect and the client library, as CDI devices.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"wormhole/kubernetes/internal/plugin"
	"wormhole/kubernetes/internal/publish"
	"wormhole/kubernetes/internal/tenants"
	"wormhole/kubernetes/internal/wh"
)

const usage = `usage: wh-dra controller|kubelet-plugin [flags]   (wh-dra COMMAND -h lists the flags)`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "controller":
		err = controller(ctx, os.Args[2:])
	case "kubelet-plugin":
		err = kubeletPlugin(ctx, os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		klog.ErrorS(err, "wh-dra stopped")
		klog.Flush()
		os.Exit(1)
	}
}

// common are the flags of both commands.
type common struct {
	kubeconfig string
	driver     string
	namespace  string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&c.driver, "driver-name", "wormhole.dev", "the DRA driver's name (DeviceClasses select it)")
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "wormhole-system"
	}
	fs.StringVar(&c.namespace, "namespace", ns, "the driver's namespace, where claims' tokens are kept (default: $POD_NAMESPACE or wormhole-system)")
	klog.InitFlags(fs)
}

func (c *common) client() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if c.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes configuration: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

func controller(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("controller", flag.ExitOnError)
	var c common
	c.register(fs)
	var pool publish.Pool
	var server wh.Server
	var memory, defaultMemory, nodeSelector, caFile string
	fs.StringVar(&pool.Name, "pool", "", "the pool's name: this server's name in the cluster (required; a DNS label)")
	fs.StringVar(&server.Wh, "wh", "wh", "the wh executable")
	fs.StringVar(&server.Socket, "socket", "/tmp/wormhole/wormhole.sock", "the server's admin socket (its --admin-socket; else its session socket)")
	fs.StringVar(&pool.Node, "node", "", "the server serves only this node's pods, on its local socket")
	fs.StringVar(&nodeSelector, "node-selector", "", "a network pool for the nodes with these labels (k=v,...; default: all nodes)")
	fs.StringVar(&pool.Endpoint, "endpoint", "", "where tenants connect: unix:///path, tcp://host:port or tls://host:port (default: the server's session socket with --node, else its TCP address)")
	fs.StringVar(&caFile, "ca-file", "", "CA certificate (PEM) tenants check a tls:// endpoint against")
	fs.StringVar(&memory, "memory", "", "memory published per device (default: the device's own)")
	fs.StringVar(&defaultMemory, "default-memory", "256Mi", "what a claim that names no memory consumes")
	fs.Int64Var(&pool.Sessions, "sessions", 64, "sessions one device serves at once, over all claims")
	_ = fs.Parse(args)
	if errs := validation.IsDNS1123Label(pool.Name); len(errs) > 0 {
		return fmt.Errorf("--pool %q: %s", pool.Name, strings.Join(errs, "; "))
	}
	if pool.Node != "" && nodeSelector != "" {
		return fmt.Errorf("--node and --node-selector exclude each other")
	}
	var err error
	if memory != "" {
		if pool.MemoryLimit, err = resource.ParseQuantity(memory); err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
	}
	if pool.DefaultMemory, err = resource.ParseQuantity(defaultMemory); err != nil {
		return fmt.Errorf("--default-memory: %w", err)
	}
	if nodeSelector != "" {
		if pool.NodeSelector, err = parseSelector(nodeSelector); err != nil {
			return err
		}
	}
	var ca []byte
	if caFile != "" {
		if ca, err = os.ReadFile(caFile); err != nil {
			return err
		}
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	inv, err := inventory(ctx, server)
	if err != nil {
		return err
	}
	if pool.Endpoint == "" {
		if pool.Endpoint, err = endpoint(pool, inv); err != nil {
			return err
		}
	}
	if strings.HasPrefix(pool.Endpoint, "tcp://") && !loopback(strings.TrimPrefix(pool.Endpoint, "tcp://")) {
		klog.InfoS("Warning: tenants' tokens and data cross the network in the clear; serve TLS (wh serve --tls-cert) for a tls:// endpoint", "endpoint", pool.Endpoint)
	}
	resources, notes := publish.Resources(pool, inv)
	for _, n := range notes {
		klog.InfoS("Device not published", "reason", n)
	}
	devices := map[string]tenants.DeviceInfo{}
	models := map[string]int{}
	for _, api := range inv.APIs {
		for i, d := range api.Devices {
			devices[publish.DeviceName(api.API, i)] = tenants.DeviceInfo{API: api.API, Model: d.Name, Sessions: pool.Sessions}
			models[d.Name]++
		}
	}
	for m, n := range models {
		if n > 1 {
			klog.InfoS("Warning: devices share a name; the server tells a tenant's devices apart by name, so a share's quota holds over all of them together", "model", m, "devices", n)
		}
	}
	// The published capacity, not the device's, is what a claim without consumed capacity gets.
	for _, d := range resources.Pools[pool.Name].Slices[0].Devices {
		info := devices[d.Name]
		published := d.Capacity[publish.Memory].Value
		info.MemoryBytes = published.Value()
		devices[d.Name] = info
	}
	klog.InfoS("Publishing the server's devices", "pool", pool.Name, "devices", len(resources.Pools[pool.Name].Slices[0].Devices), "endpoint", pool.Endpoint)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	opts := resourceslice.Options{
		DriverName: c.driver,
		KubeClient: client,
		Resources:  resources,
		// One controller per server: each reconciles its own pool only.
		ReconcilePoolWithName: pool.Name,
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			klog.FromContext(ctx).Error(err, msg)
			// Retrying cannot make an invalid slice valid: stop, saying why.
			var dropped *resourceslice.DroppedFieldsError
			if apierrors.IsInvalid(err) || errors.As(err, &dropped) {
				cancel(fmt.Errorf("the cluster refuses the pool's ResourceSlice: %w", err))
			}
		},
	}
	if pool.Node != "" {
		// Deleted with its node.
		opts.Owner = &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: pool.Node}
	}
	slices, err := resourceslice.StartController(ctx, opts)
	if err != nil {
		return err
	}
	defer slices.Stop()
	t := &tenants.Controller{Driver: c.driver, Pool: pool, Server: server, Client: client, Namespace: c.namespace, Devices: devices, CA: ca}
	if err := t.Run(ctx); err != nil {
		return err
	}
	return context.Cause(ctx)
}

// inventory asks the server for its devices until it answers with all of them: a server that
// is still starting (the controller starts beside it), or whose driver failed, must not be
// published as a pool without devices, nor have its tenants revoked for devices it lost.
func inventory(ctx context.Context, server wh.Server) (*wh.Inventory, error) {
	delay := time.Second
	for {
		inv, err := server.Devices(ctx)
		if err == nil {
			var problems []string
			found := 0
			for _, api := range inv.APIs {
				if api.Error != "" {
					problems = append(problems, api.API+": "+api.Error)
				}
				found += len(api.Devices)
			}
			if len(problems) == 0 && found > 0 {
				return inv, nil
			}
			if found == 0 {
				problems = append(problems, "no devices")
			}
			err = fmt.Errorf("the server's inventory is incomplete: %s", strings.Join(problems, "; "))
		}
		klog.InfoS("Waiting for the server's devices", "reason", err.Error(), "retryIn", delay)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}

// endpoint is where tenants connect by default: the session socket for a node's own pods,
// else the server's TCP address, which must be one the nodes can reach.
func endpoint(pool publish.Pool, inv *wh.Inventory) (string, error) {
	switch {
	case pool.Node != "":
		return "unix://" + inv.Socket, nil
	case inv.TCP == nil:
		return "", fmt.Errorf("the server listens on no TCP address: give --node (local pods) or --endpoint")
	}
	host, _, err := net.SplitHostPort(*inv.TCP)
	if err != nil {
		return "", fmt.Errorf("the server's TCP address %q: %w", *inv.TCP, err)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "", fmt.Errorf("the server listens on %s, which names no host the nodes can reach: give --endpoint", *inv.TCP)
	}
	scheme := "tcp://"
	if inv.TLS {
		scheme = "tls://"
	}
	return scheme + *inv.TCP, nil
}

// loopback says whether host:port names this machine only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func kubeletPlugin(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kubelet-plugin", flag.ExitOnError)
	var c common
	c.register(fs)
	p := &plugin.Plugin{}
	var node, pluginDir, registryDir string
	fs.StringVar(&node, "node", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	fs.StringVar(&pluginDir, "plugin-dir", "", "the plugin's socket directory (default: /var/lib/kubelet/plugins/DRIVER)")
	fs.StringVar(&registryDir, "registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&p.CDIDir, "cdi-dir", kubeletplugin.DefaultCDIDir, "where the container runtime reads CDI specs")
	fs.StringVar(&p.StateDir, "state-dir", "/var/lib/wormhole-dra/claims", "where the claims' token files are kept (never in or under a server's socket directory)")
	fs.StringVar(&p.ClientLib, "client-lib", "/var/lib/wormhole-dra/lib/libwormhole_opencl.so", "the node's Wormhole OpenCL client library")
	fs.StringVar(&p.CUDALib, "cuda-lib", "/var/lib/wormhole-dra/lib/libwormhole_cuda.so", "the node's Wormhole libcuda.so.1 (containers get it where CUDA programs look; missing: no CUDA)")
	fs.StringVar(&p.NVMLLib, "nvml-lib", "/var/lib/wormhole-dra/lib/libwormhole_nvml.so", "the node's Wormhole libnvidia-ml.so.1 (as --cuda-lib)")
	_ = fs.Parse(args)
	if node == "" {
		return fmt.Errorf("--node (or $NODE_NAME) is required")
	}
	client, err := c.client()
	if err != nil {
		return err
	}
	p.Driver = c.driver
	p.Client = client
	p.Namespace = c.namespace
	if err := p.Setup(); err != nil {
		return err
	}
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(c.driver),
		kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.HealthService(false),
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, c.driver)
	}
	opts = append(opts, kubeletplugin.PluginDataDirectoryPath(pluginDir))
	// The sockets' directories: the kubelet's own exists on a node, ours is ours to make.
	for _, d := range []string{pluginDir, registryDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	helper, err := kubeletplugin.Start(ctx, p, opts...)
	if err != nil {
		return err
	}
	defer helper.Stop()
	klog.InfoS("Kubelet plugin serving", "node", node, "driver", c.driver)
	<-ctx.Done()
	return nil
}

// parseSelector turns k=v,k2=v2 into a node selector requiring all of them.
func parseSelector(s string) (*v1.NodeSelector, error) {
	var reqs []v1.NodeSelectorRequirement
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-selector: %q is not key=value", kv)
		}
		reqs = append(reqs, v1.NodeSelectorRequirement{Key: k, Operator: v1.NodeSelectorOpIn, Values: []string{v}})
	}
	return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: reqs}}}, nil
}
