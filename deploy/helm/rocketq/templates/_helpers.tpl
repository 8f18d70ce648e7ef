{{/* Names are kept short: "<fullname>-broker-slave-9-99" must fit a 63-character DNS label. */}}
{{- define "rocketq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "rocketq.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rocketq.labels" -}}
{{ include "rocketq.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "rocketq.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* host of pod ORDINAL of StatefulSet NAME behind its headless Service NAME */}}
{{- define "rocketq.podHost" -}}
{{ .name }}-{{ .ordinal }}.{{ .name }}.{{ .root.Release.Namespace }}.svc.{{ .root.Values.clusterDomain }}
{{- end -}}

{{/* nameserver addresses by their stable DNS names, never pod IPs: host:port;host:port */}}
{{- define "rocketq.namesrvAddr" -}}
{{- $root := . -}}
{{- $name := printf "%s-nameserver" (include "rocketq.fullname" .) -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.nameserver.replicas) -}}
{{- $addrs = append $addrs (printf "%s:%d" (include "rocketq.podHost" (dict "root" $root "name" $name "ordinal" $i)) (int $root.Values.nameserver.port)) -}}
{{- end -}}
{{- join ";" $addrs -}}
{{- end -}}

{{- define "rocketq.etcdEndpoints" -}}
{{- $root := . -}}
{{- if .Values.etcd.bundled -}}
{{- $name := printf "%s-etcd" (include "rocketq.fullname" .) -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $addrs = append $addrs (printf "%s:%d" (include "rocketq.podHost" (dict "root" $root "name" $name "ordinal" $i)) (int $root.Values.etcd.clientPort)) -}}
{{- end -}}
{{- join ";" $addrs -}}
{{- else -}}
{{- join ";" .Values.etcd.externalEndpoints -}}
{{- end -}}
{{- end -}}

{{- define "rocketq.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.podSecurityContext.runAsUser }}
runAsGroup: {{ .Values.podSecurityContext.runAsGroup }}
fsGroup: {{ .Values.podSecurityContext.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "rocketq.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: {{ .Values.readOnlyRootFilesystem }}
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Native gRPC probes on grpc.health.v1 (Kubernetes 1.27+). A probe cannot speak TLS, so
     with tls.enabled the probes only check that the port accepts connections. */}}
{{- define "rocketq.probes" -}}
{{- $check := dict -}}
{{- if .root.Values.tls.enabled -}}
{{- $check = dict "tcpSocket" (dict "port" "grpc") -}}
{{- else -}}
{{- $check = dict "grpc" (dict "port" (int .port)) -}}
{{- end -}}
startupProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  {{- toYaml $check | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
{{- end -}}

{{/* Environment shared by every service: pod name, TLS, metrics, log level, extra keys.
     .prefix is the service's ROCKETQ_<SERVICE>_ prefix. */}}
{{- define "rocketq.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: {{ .prefix }}LOGLEVEL
  value: {{ .root.Values.logLevel | quote }}
{{- if .root.Values.tls.enabled }}
- name: {{ .prefix }}TLSCERTFILE
  value: /etc/rocketq/tls/tls.crt
- name: {{ .prefix }}TLSKEYFILE
  value: /etc/rocketq/tls/tls.key
- name: {{ .prefix }}TLSCAFILE
  value: /etc/rocketq/tls/ca.crt
- name: {{ .prefix }}TLSCLIENTAUTH
  value: {{ .root.Values.tls.clientAuth | quote }}
{{- end }}
{{- if gt (int .root.Values.metrics.port) 0 }}
- name: {{ .prefix }}METRICSPORT
  value: {{ .root.Values.metrics.port | quote }}
{{- end }}
{{- range $key, $value := .config }}
- name: {{ printf "%s%s" $.prefix (upper $key) }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- define "rocketq.ports" -}}
- name: grpc
  containerPort: {{ .port }}
{{- if gt (int (.gatewayPort | default 0)) 0 }}
- name: gateway
  containerPort: {{ .gatewayPort }}
{{- end }}
{{- if gt (int (.haPort | default 0)) 0 }}
- name: ha
  containerPort: {{ .haPort }}
{{- end }}
{{- if gt (int .root.Values.metrics.port) 0 }}
- name: metrics
  containerPort: {{ .root.Values.metrics.port }}
{{- end }}
{{- end -}}

{{- define "rocketq.tlsVolumeMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/rocketq/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "rocketq.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
{{- end -}}

{{- define "rocketq.storageClassName" -}}
{{- .Values.persistence.storageClassName | default (printf "%s-local" (include "rocketq.fullname" .)) -}}
{{- end -}}

{{- define "rocketq.retention" -}}
{{- if .Values.persistence.retainOnScaleDown }}
persistentVolumeClaimRetentionPolicy:
  whenScaled: Retain
  whenDeleted: Retain
{{- else }}
persistentVolumeClaimRetentionPolicy:
  whenScaled: Delete
  whenDeleted: Retain
{{- end }}
{{- end -}}

{{/* headless Service of StatefulSet .name: stable per-pod DNS names, also before readiness
     (a starting broker must reach the nameservers, a slave its master). */}}
{{- define "rocketq.headlessService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ .name }}
  labels:
    {{- include "rocketq.labels" . | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "rocketq.selectorLabels" . | nindent 4 }}
    rocketq.io/statefulset: {{ .name }}
  ports:
    {{- range .ports }}
    - name: {{ .name }}
      port: {{ .port }}
      targetPort: {{ .name }}
    {{- end }}
{{- end -}}

{{- define "rocketq.pdb" -}}
{{- if .root.Values.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  labels:
    {{- include "rocketq.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "rocketq.selectorLabels" . | nindent 6 }}
      rocketq.io/statefulset: {{ .name }}
{{- end }}
{{- end -}}
