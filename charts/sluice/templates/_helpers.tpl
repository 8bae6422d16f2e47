{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: the release name, with the chart's name unless it holds it. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "sluice.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "sluice.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the release's pods. */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Kubernetes' recommended labels. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: worker
app.kubernetes.io/part-of: sluice
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sluice.configMapName" -}}
{{- default (printf "%s-pipeline" (include "sluice.fullname" .)) .Values.pipeline.existingConfigMap -}}
{{- end -}}

{{- define "sluice.secretName" -}}
{{- default (printf "%s-store" (include "sluice.fullname" .)) .Values.store.existingSecret -}}
{{- end -}}

{{/* A memory quantity (integer, with an optional binary or decimal suffix) in MiB. */}}
{{- define "sluice.memoryMiB" -}}
{{- $q := toString . -}}
{{- if hasSuffix "Gi" $q -}}{{ mul (trimSuffix "Gi" $q | int64) 1024 }}
{{- else if hasSuffix "Mi" $q -}}{{ trimSuffix "Mi" $q | int64 }}
{{- else if hasSuffix "Ki" $q -}}{{ div (trimSuffix "Ki" $q | int64) 1024 }}
{{- else if hasSuffix "G" $q -}}{{ div (mul (trimSuffix "G" $q | int64) 1000000000) 1048576 }}
{{- else if hasSuffix "M" $q -}}{{ div (mul (trimSuffix "M" $q | int64) 1000000) 1048576 }}
{{- else if hasSuffix "k" $q -}}{{ div (mul (trimSuffix "k" $q | int64) 1000) 1048576 }}
{{- else -}}{{ div ($q | int64) 1048576 }}
{{- end -}}
{{- end -}}

{{/* The pipeline's name: autoscaling.keda.pipelineName, else the chart's pipeline file's. */}}
{{- define "sluice.pipelineName" -}}
{{- if .Values.autoscaling.keda.pipelineName -}}
{{- .Values.autoscaling.keda.pipelineName -}}
{{- else if .Values.pipeline.file -}}
{{- get (fromYaml .Values.pipeline.file) "pipeline" -}}
{{- end -}}
{{- end -}}

{{/* Refuses values that cannot work, with the reason (the schema checks types and ranges). */}}
{{- define "sluice.validate" -}}
{{- if and .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled -}}
{{- fail "autoscaling: enable either hpa or keda, not both (both would own the Deployment's replicas)" -}}
{{- end -}}
{{- if and .Values.monitoring.serviceMonitor.enabled .Values.monitoring.podMonitor.enabled -}}
{{- fail "monitoring: enable either serviceMonitor or podMonitor, not both (each worker would be scraped twice)" -}}
{{- end -}}
{{- if and (not .Values.pipeline.existingConfigMap) (not (trim .Values.pipeline.file)) -}}
{{- fail "pipeline: set pipeline.file (the pipeline YAML) or pipeline.existingConfigMap" -}}
{{- end -}}
{{- if and .Values.store.url .Values.store.existingSecret -}}
{{- fail "store: set store.url or store.existingSecret, not both (the URL would be ignored)" -}}
{{- end -}}
{{- if and (not .Values.serviceAccount.create) (or .Values.serviceAccount.gcpServiceAccount .Values.serviceAccount.annotations) -}}
{{- fail "serviceAccount: gcpServiceAccount and annotations go on a service account the chart creates (serviceAccount.create); annotate your own account yourself" -}}
{{- end -}}
{{- if .Values.pipeline.file -}}
{{- $file := fromYaml .Values.pipeline.file -}}
{{- if hasKey $file "Error" -}}
{{- fail (printf "pipeline.file is not YAML: %s" (index $file "Error")) -}}
{{- end -}}
{{- if and .Values.pubsub.project (hasKey $file "pubsub") (hasKey (get $file "pubsub") "project") -}}
{{- fail "pubsub.project: the pipeline file names a project already (its pubsub.project wins); set one of them" -}}
{{- end -}}
{{- $listen := "" -}}
{{- if kindIs "map" (get $file "metrics") -}}
{{- $listen = toString (get (get $file "metrics") "listen") -}}
{{- end -}}
{{- if or (not (hasSuffix (printf ":%v" .Values.metrics.port) $listen)) (hasPrefix "127." $listen) (hasPrefix "localhost" $listen) -}}
{{- fail (printf "pipeline.file: metrics.listen is %q; the pool needs it on all interfaces at metrics.port (\"0.0.0.0:%v\"): the probes, the Service and Prometheus reach it there" $listen .Values.metrics.port) -}}
{{- end -}}
{{- $named := toString (get $file "pipeline") -}}
{{- with .Values.autoscaling.keda -}}
{{- if and .enabled .pipelineName (ne .pipelineName $named) -}}
{{- fail (printf "autoscaling.keda.pipelineName %q is not the pipeline file's %q (the lag query would find nothing)" .pipelineName $named) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- with .Values.autoscaling.keda -}}
{{- if and .enabled .prometheus.enabled (not .pipelineName) -}}
{{- fail "autoscaling.keda.pipelineName: name the pipeline of pipeline.existingConfigMap (its `pipeline:`), for the lag query" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with .Values.autoscaling.hpa -}}
{{- if and .enabled (gt (int .minReplicas) (int .maxReplicas)) -}}
{{- fail "autoscaling.hpa: minReplicas is above maxReplicas" -}}
{{- end -}}
{{- end -}}
{{- with .Values.autoscaling.keda -}}
{{- if and .enabled (gt (int .minReplicaCount) (int .maxReplicaCount)) -}}
{{- fail "autoscaling.keda: minReplicaCount is above maxReplicaCount" -}}
{{- end -}}
{{- if and .enabled (lt (int .minReplicaCount) 1) (not .gcpPubsub.enabled) -}}
{{- fail "autoscaling.keda.minReplicaCount: 0 needs the gcpPubsub trigger (with no worker, sluice's own metrics are gone and the Prometheus trigger never scales up again)" -}}
{{- end -}}
{{- end -}}
{{- with .Values.resources.limits -}}
{{- if .memory -}}
{{- if lt (include "sluice.memoryMiB" .memory | int64) 512 -}}
{{- fail (printf "resources.limits.memory %s is below 512Mi: one Pub/Sub flow holds up to 2,000,000 dedup keys in memory and 100 MiB of messages under flow control" (toString .memory)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.control.enabled (not .Values.control.tokenSecret) -}}
{{- fail "control.enabled: set control.tokenSecret (a Secret with key token); the control API needs a bearer token off loopback" -}}
{{- end -}}
{{- if and .Values.autoscaling.keda.enabled .Values.autoscaling.keda.gcpPubsub.enabled (not .Values.autoscaling.keda.gcpPubsub.subscriptionName) -}}
{{- fail "autoscaling.keda.gcpPubsub.subscriptionName: name the subscription whose backlog to scale on" -}}
{{- end -}}
{{- if and .Values.autoscaling.keda.enabled (not .Values.autoscaling.keda.prometheus.enabled) (not .Values.autoscaling.keda.gcpPubsub.enabled) -}}
{{- fail "autoscaling.keda: enable the prometheus trigger, the gcpPubsub trigger, or both" -}}
{{- end -}}
{{- end -}}
