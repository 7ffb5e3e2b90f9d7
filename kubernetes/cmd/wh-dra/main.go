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
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&c.driver, "driver-name", "wormhole.dev", "the DRA driver's name (DeviceClasses select it)")
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
	fs.StringVar(&pool.Name, "pool", "", "the pool's name: this server's name in the cluster (required)")
	fs.StringVar(&server.Wh, "wh", "wh", "the wh executable")
	fs.StringVar(&server.Socket, "socket", "/tmp/wormhole/wormhole.sock", "the server's Unix socket")
	fs.StringVar(&pool.Node, "node", "", "the server serves only this node's pods, on its local socket")
	fs.StringVar(&nodeSelector, "node-selector", "", "a network pool for the nodes with these labels (k=v,...; default: all nodes)")
	fs.StringVar(&pool.Endpoint, "endpoint", "", "where tenants connect: unix:///path, tcp://host:port or tls://host:port (default: the server's socket with --node, else its TCP address)")
	fs.StringVar(&caFile, "ca-file", "", "CA certificate (PEM) tenants check a tls:// endpoint against")
	fs.StringVar(&memory, "memory", "", "memory published per device (default: the device's own)")
	fs.StringVar(&defaultMemory, "default-memory", "256Mi", "what a claim that names no memory consumes")
	fs.Int64Var(&pool.Sessions, "sessions", 64, "sessions one device serves at once, over all claims")
	_ = fs.Parse(args)
	if pool.Name == "" {
		return fmt.Errorf("--pool is required")
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
	inv, err := server.Devices(ctx)
	if err != nil {
		return err
	}
	if pool.Endpoint == "" {
		switch {
		case pool.Node != "":
			pool.Endpoint = "unix://" + inv.Socket
		case inv.TCP != nil && inv.TLS:
			pool.Endpoint = "tls://" + *inv.TCP
		case inv.TCP != nil:
			pool.Endpoint = "tcp://" + *inv.TCP
		default:
			return fmt.Errorf("the server listens on no TCP address: give --node (local pods) or --endpoint")
		}
	}
	resources, err := publish.Resources(pool, inv)
	if err != nil {
		return err
	}
	devices := map[string]tenants.DeviceInfo{}
	for _, api := range inv.APIs {
		if api.Error != "" {
			klog.InfoS("The server cannot list an API's devices", "api", api.API, "reason", api.Error)
		}
		for i, d := range api.Devices {
			devices[fmt.Sprintf("%s-%d", api.API, i)] = tenants.DeviceInfo{API: api.API, Model: d.Name, MemoryBytes: int64(d.MemoryBytes), Sessions: pool.Sessions}
		}
	}
	// The published capacity, not the device's, is what a claim without consumed capacity gets.
	for _, d := range resources.Pools[pool.Name].Slices[0].Devices {
		info := devices[d.Name]
		published := d.Capacity[publish.Memory].Value
		info.MemoryBytes = published.Value()
		devices[d.Name] = info
	}
	klog.InfoS("Publishing the server's devices", "pool", pool.Name, "devices", len(devices), "endpoint", pool.Endpoint)
	slices, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: c.driver,
		KubeClient: client,
		Resources:  resources,
		// One controller per server: each reconciles its own pool only.
		ReconcilePoolWithName: pool.Name,
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			klog.FromContext(ctx).Error(err, msg)
		},
	})
	if err != nil {
		return err
	}
	defer slices.Stop()
	t := &tenants.Controller{Driver: c.driver, Pool: pool, Server: server, Client: client, Devices: devices, CA: ca}
	return t.Run(ctx)
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
	fs.StringVar(&p.StateDir, "state-dir", "/var/run/wormhole/claims", "where the claims' token files are kept")
	fs.StringVar(&p.ClientLib, "client-lib", "/usr/lib/wormhole/libwormhole_opencl.so", "the node's Wormhole OpenCL client library")
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
