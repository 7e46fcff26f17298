/**
 * The node-local model of kpng's localv1 API (see shared/kpng-localv1.md).
 * Field names are the Go/proto names, so the JSON encoder can print them as
 * they are. Presence matters: an `undefined` message field is absent (omitted
 * in JSON), a present-but-empty one prints as `{}`.
 */

/** Addresses of one kind, split by family. */
export interface IPSet {
  V4?: string[];
  V6?: string[];
}

export interface ServiceIPs {
  ClusterIPs?: IPSet;
  ExternalIPs?: IPSet;
  LoadBalancerIPs?: IPSet;
  Headless?: boolean;
}

export interface IPFilter {
  TargetIPs?: IPSet;
  SourceRanges?: string[];
}

/** Protocol enum: 0 unknown, 1 TCP, 2 UDP, 3 SCTP. */
export type Protocol = number;

export interface PortMapping {
  Name?: string;
  Protocol?: Protocol;
  Port?: number;
  NodePort?: number;
  TargetPort?: number;
  TargetPortName?: string;
}

export interface ClientIPAffinity {
  TimeoutSeconds?: number;
}

/** The `SessionAffinity` oneof; `ClientIP` is its only member. */
export interface SessionAffinity {
  ClientIP?: ClientIPAffinity;
}

export interface Service {
  Namespace?: string;
  Name?: string;
  Type?: string;
  Labels?: Record<string, string>;
  Annotations?: Record<string, string>;
  IPs?: ServiceIPs;
  IPFilters?: IPFilter[];
  MapIP?: boolean;
  Ports?: PortMapping[];
  ExternalTrafficToLocal?: boolean;
  /** Unset oneof prints as `null`. */
  SessionAffinity?: SessionAffinity;
  InternalTrafficToLocal?: boolean;
  HealthCheckNodePort?: number;
}

export interface PortName {
  Name?: string;
  Port?: number;
}

export interface EndpointScopes {
  Internal?: boolean;
  External?: boolean;
}

export interface Endpoint {
  Hostname?: string;
  IPs?: IPSet;
  Local?: boolean;
  PortOverrides?: PortName[];
  Scopes?: EndpointScopes;
}

/** One NDJSON line: a Service and the endpoints under its path. */
export interface ServiceEndpoints {
  Service: Service;
  Endpoints: Endpoint[];
}

/** localv1 `Set` enum values a node-local client handles. */
export const ServicesSet = 1;
export const EndpointsSet = 2;
