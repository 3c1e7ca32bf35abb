"""Deployment objects: Kubernetes manifests and the generator of their copies of shipped files."""
